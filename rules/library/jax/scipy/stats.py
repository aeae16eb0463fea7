"""`jax.scipy.stats`, with log-densities whose gradients are right at their boundaries."""

from __future__ import annotations

import jax.scipy.stats as _jst

from .._shadow import fallback as _fallback

SHADOWED: tuple[str, ...] = ()

__getattr__, __dir__ = _fallback(__name__, _jst, {name: None for name in SHADOWED})
