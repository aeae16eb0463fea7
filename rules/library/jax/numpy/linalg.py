"""`jax.numpy.linalg`, with the library's `norm`, `det` and `inv` (rules.library.linalg).

>>> import jax, jax.numpy
>>> import rules.library.jax.numpy as jnp
>>> jax.grad(jnp.linalg.norm)(jax.numpy.zeros(3)).tolist()   # JAX: NaN
[0.0, 0.0, 0.0]
"""

from __future__ import annotations

from typing import Any

import jax.numpy as _jnp
import numpy as _np

from ... import linalg as _linalg
from .._shadow import fallback as _fallback
from .._shadow import like as _like


def _matrix_ord(x: Any, ord: Any, axis: Any) -> Any:
    """A float ord of a matrix norm as the static ord it means (`np.inf` -> "inf", 2.0 -> 2):
    `jnp.linalg.norm` reads ord statically, while the library's norm traces a Python float as
    a differentiable p, which only vector norms have."""
    matrix = (axis is None and _np.ndim(x) == 2) or (isinstance(axis, tuple) and len(axis) == 2)
    if not matrix or not isinstance(ord, (float, _np.floating)) or isinstance(ord, bool):
        return ord
    if _np.isinf(ord):
        return "inf" if ord > 0 else "-inf"
    return int(ord) if float(ord).is_integer() else ord


@_like(_jnp.linalg.norm)
def norm(x, ord=None, axis=None, keepdims=False):  # zero subgradient at 0, scaled against under/overflow
    return _linalg.norm(x, _matrix_ord(x, ord, axis), axis, keepdims)


@_like(_jnp.linalg.det)
def det(a):
    return _linalg.det(a)


@_like(_jnp.linalg.inv)
def inv(a):
    return _linalg.inv(a)


SHADOWED = ("norm", "det", "inv")

__getattr__, __dir__ = _fallback(__name__, _jnp.linalg, SHADOWED)
