"""`jax.numpy.linalg`, with the library's `norm`, `det` and `inv` (rules.library.linalg).

>>> import jax, jax.numpy
>>> import rules.library.jax.numpy as jnp
>>> jax.grad(jnp.linalg.norm)(jax.numpy.zeros(3)).tolist()   # JAX: NaN
[0.0, 0.0, 0.0]
"""

from __future__ import annotations

import jax.numpy as _jnp

from ... import linalg as _linalg
from .._shadow import fallback as _fallback
from .._shadow import like as _like

norm = _linalg.norm  # zero subgradient at 0, scaled against under/overflow


@_like(_jnp.linalg.det)
def det(a):
    return _linalg.det(a)


@_like(_jnp.linalg.inv)
def inv(a):
    return _linalg.inv(a)


SHADOWED = ("norm", "det", "inv")

__getattr__, __dir__ = _fallback(__name__, _jnp.linalg, {name: None for name in SHADOWED})
