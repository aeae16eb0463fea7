"""`jax.scipy.linalg`, with the library's `polar` (smooth at orthogonal matrices)."""

from __future__ import annotations

import jax.scipy.linalg as _jsl

from .._shadow import fallback as _fallback

SHADOWED: tuple[str, ...] = ()

__getattr__, __dir__ = _fallback(__name__, _jsl, {name: None for name in SHADOWED})
