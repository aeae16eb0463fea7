"""Log-densities of `jax.scipy.stats` with the right gradients at their boundaries (being written)."""

from __future__ import annotations

__all__: list[str] = []
