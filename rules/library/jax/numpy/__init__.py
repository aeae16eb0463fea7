"""`jax.numpy`, with the library's rules where they are right and JAX is not.

Change `import jax.numpy as jnp` to `import rules.library.jax.numpy as jnp`: the names in
`SHADOWED` are `rules.primitive`s (of the JAX function itself, so values and signatures are
JAX's, derivatives the library's; `jax.grad`, `jax.jit`, `jax.vmap` and
`zygote_jax.gradient` use them); every other name is JAX's own object.

>>> import jax
>>> import rules.library.jax.numpy as jnp
>>> [float(g) for g in jax.grad(jnp.hypot, argnums=(0, 1))(0.0, 0.0)]   # plain JAX: NaN (jax 0.10: 0.5 each)
[0.0, 0.0]
>>> jnp.sin is jax.numpy.sin   # no rule of ours adds anything there
True

See also: `rules.library.jax.nn`, `rules.library.jax.scipy`.
"""

from __future__ import annotations

import jax.numpy as _jnp

from ... import elementwise as _elementwise  # noqa: F401  (registers the rules used below)
from ...._primitive import primitive as _primitive
from .._shadow import Ufunc as _Ufunc
from .._shadow import fallback as _fallback
from .._shadow import like as _like
from . import linalg as linalg

# ----- the value-added rules of rules.library.elementwise, on JAX's own functions --------------
abs = absolute = _primitive(_jnp.abs)  # 0 at 0 (JAX: 1 for real, NaN for complex)
sign = _primitive(_jnp.sign)  # complex: z / |z| turns with z (JAX: 0)
hypot = _primitive(_jnp.hypot)  # 0 at (0, 0) (JAX: (1, 0) or NaN)
arctan2 = _primitive(_jnp.arctan2)  # finite at 1e-200 (JAX before 0.12.1: inf)
sinc = _primitive(_jnp.sinc)  # near 0 by its series (JAX: rounding noise at 1e-8)
arcsinh = _primitive(_jnp.arcsinh)  # 1e200 (JAX: 0)
arccosh = _primitive(_jnp.arccosh)  # 1e200 (JAX: 0); complex on the principal branch
tanh = _primitive(_jnp.tanh)  # float32 tails (JAX: 0 at -9.01)
expm1 = _primitive(_jnp.expm1)  # exp, not y + 1 (JAX 0.10: 0 at -40)
power = pow = _primitive(_jnp.power)  # x = 0 as ChainRules' table (JAX: NaN at 0**0)
logaddexp = _Ufunc(_jnp.logaddexp)  # a tie in float32, two -inf (JAX: NaN; before 0.12.1 1 at the tie)
logaddexp2 = _Ufunc(_jnp.logaddexp2)


# ----- functions JAX builds from the ones above, rebuilt on ours ------------------------------
@_like(_jnp.vander)
def vander(x, N=None, increasing=False):
    x = _jnp.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"`vander`: x must be one-dimensional; got shape {x.shape}.")
    n = x.shape[0] if N is None else N
    exponents = _jnp.arange(n) if increasing else _jnp.arange(n - 1, -1, -1)
    exponents = exponents.astype(x.dtype) if _jnp.issubdtype(x.dtype, _jnp.inexact) else exponents
    return power(x[:, None], exponents[None, :])


SHADOWED = (
    "abs", "absolute", "sign", "hypot", "arctan2", "sinc", "arcsinh", "arccosh", "tanh", "expm1",
    "power", "pow", "logaddexp", "logaddexp2", "vander", "linalg",
)  # fmt: skip

__getattr__, __dir__ = _fallback(__name__, _jnp, SHADOWED)
