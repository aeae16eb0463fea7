"""`jax.scipy.stats`, with log-densities whose gradients are right at their boundaries.

`from rules.library.jax.scipy import stats` for `from jax.scipy import stats`: each
distribution in `SHADOWED` is JAX's module with the functions of `rules.library.stats`
(`logpdf`, `pdf`, `logpmf`, `pmf`, and truncnorm's `logcdf`, `cdf`) in place of JAX's, with
JAX's signatures and values; its other functions (`cdf`, `sf`, ...), and every other
distribution, are JAX's own.

>>> import jax
>>> from rules.library.jax.scipy import stats
>>> float(jax.grad(stats.poisson.logpmf, argnums=1)(0.0, 0.0))   # JAX: NaN
-1.0
>>> stats.gamma.cdf is jax.scipy.stats.gamma.cdf
True
"""

from __future__ import annotations

import jax.scipy.stats as _jst

from ... import stats as _stats
from .._shadow import fallback as _fallback
from .._shadow import overlay as _overlay

SHADOWED = ("gamma", "chi2", "beta", "poisson", "binom", "bernoulli", "geom", "nbinom", "betabinom", "multinomial",
            "truncnorm")

for _name in SHADOWED:
    globals()[_name] = _overlay(f"{__name__}.{_name}", getattr(_jst, _name), vars(getattr(_stats, _name)))
del _name

__getattr__, __dir__ = _fallback(__name__, _jst, SHADOWED)
