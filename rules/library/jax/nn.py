"""`jax.nn`, with the library's rules where they are right and JAX is not.

`from rules.library.jax import nn` for `from jax import nn`: the names in `SHADOWED` are the
library's (`rules.library.nn` and elementwise rules on JAX's own functions), with JAX's
signatures; every other name is JAX's object.

>>> import jax, numpy as np
>>> from rules.library.jax import nn
>>> float(jax.grad(nn.sigmoid)(np.float32(17.0))) > 0   # JAX: 0.0 (1 - y rounds to 0)
True

See also: `rules.library.jax.numpy`, `rules.library.nn`.
"""

from __future__ import annotations

import jax.nn as _jnn

from .. import elementwise as _elementwise  # noqa: F401  (registers the rules used below)
from .. import logexp as _logexp
from .. import nn as _nn
from ..._primitive import primitive as _primitive
from ._shadow import fallback as _fallback
from ._shadow import like as _like

sigmoid = _primitive(_jnn.sigmoid)  # s(x) s(-x): float32 tails (JAX: 0 at 17)
elu = _primitive(_jnn.elu)  # alpha exp(x) (JAX 0.10: 0 at -40)
selu = _primitive(_jnn.selu)
celu = _primitive(_jnn.celu)
silu = swish = _primitive(_jnn.silu)  # slope by sigmoid's rule: its derivative is right in the tails (JAX: 0 past ~37)
softplus = _nn.softplus  # finite for any x
log_sigmoid = _nn.log_sigmoid  # finite where sigmoid underflows
squareplus = _nn.squareplus  # finite where x**2 overflows
logsumexp = _logexp.logsumexp  # d/db where b = 0 (JAX: 0)


@_like(_jnn.gelu)
def gelu(x, approximate=True):  # JAX's default, the tanh form
    return _nn.gelu(x, approximate)


SHADOWED = ("sigmoid", "elu", "selu", "celu", "silu", "swish", "softplus", "log_sigmoid", "squareplus", "gelu", "logsumexp")

__getattr__, __dir__ = _fallback(__name__, _jnn, SHADOWED)
