"""`jax.scipy.special`, with the library's rules where they are right and JAX is not.

`from rules.library.jax.scipy import special` for `from jax.scipy import special`. The names
in `SHADOWED` are the library's, with JAX's signatures; `EXTRA` are SciPy functions JAX does
not have (`kv`, `iv`, `jv`, `yv`, `struve`, ...: `rules.library.special`); every other name is
JAX's object.

>>> import jax
>>> from rules.library.jax.scipy import special
>>> float(jax.grad(special.xlogy, argnums=1)(0.0, 0.0))   # JAX: NaN
0.0
"""

from __future__ import annotations

import jax.scipy.special as _jsp

from ... import elementwise as _elementwise  # noqa: F401  (registers the rules used below)
from ... import logexp as _logexp  # noqa: F401
from ... import special as _special
from ...._primitive import primitive as _primitive
from .._shadow import fallback as _fallback

expit = _primitive(_jsp.expit)  # s(x) s(-x): float32 tails
xlogy = _primitive(_jsp.xlogy)  # d/dy = 0 where x = 0 (JAX: NaN at (0, 0))
xlog1py = _primitive(_jsp.xlog1py)

# SciPy's, which JAX lacks (host calls, see rules.library.special)
kv, kve, iv, ive, jv, yv, struve = (_special.kv, _special.kve, _special.iv, _special.ive,
                                    _special.jv, _special.yv, _special.struve)  # fmt: skip

SHADOWED = ("expit", "xlogy", "xlog1py")
EXTRA = ("kv", "kve", "iv", "ive", "jv", "yv", "struve")

__getattr__, __dir__ = _fallback(__name__, _jsp, {name: None for name in SHADOWED + EXTRA})
