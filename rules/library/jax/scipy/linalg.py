"""`jax.scipy.linalg`, with the library's `polar` (differentiable at orthogonal matrices).

>>> import jax, jax.numpy as jnp
>>> from rules.library.jax.scipy import linalg
>>> bool(jnp.isfinite(jax.grad(lambda a: linalg.polar(a)[0][0, 1])(jnp.eye(2))).all())   # JAX: error or NaN
True
"""

from __future__ import annotations

import jax.scipy.linalg as _jsl

from ... import linalg_polar as _linalg_polar
from .._shadow import fallback as _fallback

polar = _linalg_polar.polar  # smooth wherever a has full rank

SHADOWED = ("polar",)

__getattr__, __dir__ = _fallback(__name__, _jsl, SHADOWED)
