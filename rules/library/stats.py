"""Log-densities of `jax.scipy.stats` with the right gradients at their boundaries.

Each function has exactly the signature of its `jax.scipy.stats` namesake and the same
value (JAX 0.12's, where 0.10.2 differed: chi2 at x = 0, poisson's support test), and is
written with `rules.library.logexp`'s `xlogy` / `xlog1py`, whose derivative in y is exactly 0
where x == 0. That is what the boundaries need: at x = 0 with a = 1 the gamma density's
x^(a-1) = x^0 term is constant, so d/dx logpdf is -1/scale there, where JAX's gradient is NaN
(its xlogy's 0/0). The functions are plain JAX code over primitives (JAX differentiates
through them); `log_gauss_mass`, log(Phi(b) - Phi(a)), is a primitive of its own.

Namespaces as in `jax.scipy.stats`: `stats.gamma.logpdf` is `gamma_logpdf`, and so on for
`gamma`, `chi2`, `beta` (logpdf, pdf), `poisson` (logpmf, pmf), `binom`, `bernoulli`,
`geom`, `nbinom`, `betabinom`, `multinomial` (logpmf, pmf) and `truncnorm` (logpdf, pdf,
logcdf, cdf). `beta` and `betabinom` take log B(a, b) from `jax.scipy.special.betaln`'s rule
(`rules.library.special_jax`), whose derivatives are digammas and polygammas: JAX 0.10's own
second derivatives of log B are wrong where a = b.
The discrete distributions are written in `rules.library._stats_discrete` (this file's size).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
from jax.scipy.stats import norm as _norm

from .._helpers import scalar_rule
from .._primitive import primitive
from ._stats_discrete import _promote
from ._stats_discrete import bernoulli as bernoulli
from ._stats_discrete import betabinom as betabinom
from ._stats_discrete import binom as binom
from ._stats_discrete import geom as geom
from ._stats_discrete import multinomial as multinomial
from ._stats_discrete import nbinom as nbinom
from ._stats_discrete import poisson as poisson
from .logexp import xlog1py, xlogy
from .special_jax import _betaln  # jax.scipy.special.betaln by its rule: JAX 0.10's Hessian is wrong

__all__ = [
    "gamma", "chi2", "beta", "poisson", "binom", "bernoulli", "geom", "nbinom", "betabinom", "multinomial", "truncnorm",
    "log_gauss_mass",
]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


# ----- gamma ----------------------------------------------------------------------------------
def gamma_logpdf(x, a, loc=0, scale=1):
    """Log-density of the gamma distribution: `jax.scipy.stats.gamma.logpdf` with the right
    gradient at x = loc.

    Why: (a - 1) log y is `xlogy`, whose d/dy is 0 where a == 1, so at x = loc, a = 1 the
    gradient in x is -1/scale (the exponential density's), where JAX's is NaN.

    Args:
      x: where to evaluate; -inf below `loc`.
      a: the shape, a > 0.
      loc: the offset.
      scale: the scale, scale > 0.

    Returns:
      log f(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import gamma
    >>> float(gamma.logpdf(0.0, 1.0, scale=2.0) + 0.6931471805599453), float(jax.grad(gamma.logpdf)(0.0, 1.0, 0.0, 2.0))
    (0.0, -0.5)

    See also: `gamma_pdf`, `jax.scipy.stats.gamma.logpdf`.
    """
    x, a, loc, scale = _promote("gamma.logpdf", x, a, loc, scale)
    ok = x >= loc
    y = jnp.where(ok, (x - loc) / scale, jnp.ones_like(x))
    log_probs = xlogy(a - 1, y) - y - (jsp.gammaln(a) + jnp.log(scale))
    return jnp.where(ok, log_probs, -jnp.inf)


def gamma_pdf(x, a, loc=0, scale=1):
    """Density of the gamma distribution, exp(`gamma_logpdf`): d/dx at x = 0, a = 1 is -1/scale^2.

    Args:
      x, a, loc, scale: as `gamma_logpdf`.

    Returns:
      f(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import gamma
    >>> float(jax.grad(gamma.pdf)(0.0, 1.0))
    -1.0

    See also: `gamma_logpdf`, `jax.scipy.stats.gamma.pdf`.
    """
    return jnp.exp(gamma_logpdf(x, a, loc, scale))


gamma = SimpleNamespace(logpdf=gamma_logpdf, pdf=gamma_pdf)


# ----- chi2 -----------------------------------------------------------------------------------
def chi2_logpdf(x, df, loc=0, scale=1):
    """Log-density of the chi-squared distribution: `jax.scipy.stats.chi2.logpdf` with the
    right value and gradient at x = loc.

    Why: (df/2 - 1) log y is `xlogy`, so at x = 0 with df = 2 the value is -log 2 (JAX 0.10.2:
    NaN) and d/dx is -1/2 (JAX: NaN).

    Args:
      x: where to evaluate; -inf below `loc`.
      df: the degrees of freedom, df > 0.
      loc: the offset.
      scale: the scale, scale > 0.

    Returns:
      log f(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import chi2
    >>> float(jax.grad(chi2.logpdf)(0.0, 2.0))
    -0.5

    See also: `chi2_pdf`, `jax.scipy.stats.chi2.logpdf`.
    """
    x, df, loc, scale = _promote("chi2.logpdf", x, df, loc, scale)
    y = (x - loc) / scale
    half = df / 2
    kernel = xlogy(half - 1, y) - y / 2
    normaliser = -(jsp.gammaln(half) + math.log(2.0) * df / 2)
    return jnp.where(x < loc, -jnp.inf, normaliser - jnp.log(scale) + kernel)


def chi2_pdf(x, df, loc=0, scale=1):
    """Density of the chi-squared distribution, exp(`chi2_logpdf`): d/dx at x = 0, df = 2 is -1/4.

    Args:
      x, df, loc, scale: as `chi2_logpdf`.

    Returns:
      f(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import chi2
    >>> float(chi2.pdf(0.0, 2.0)), float(jax.grad(chi2.pdf)(0.0, 2.0))
    (0.5, -0.25)

    See also: `chi2_logpdf`, `jax.scipy.stats.chi2.pdf`.
    """
    return jnp.exp(chi2_logpdf(x, df, loc, scale))


chi2 = SimpleNamespace(logpdf=chi2_logpdf, pdf=chi2_pdf)


# ----- beta -----------------------------------------------------------------------------------
def beta_logpdf(x, a, b, loc=0, scale=1):
    """Log-density of the beta distribution: `jax.scipy.stats.beta.logpdf` with the right
    gradients at x = 0 (a = 1) and x = 1 (b = 1).

    Why: (a - 1) log y and (b - 1) log(1 - y) are `xlogy` / `xlog1py`, so at x = 0 with a = 1
    d/dx is -(b - 1) and at x = 1 with b = 1 it is a - 1, where JAX's are NaN.

    Args:
      x: where to evaluate; -inf outside [loc, loc + scale].
      a, b: the shapes, > 0 (NaN otherwise, as JAX).
      loc: the offset.
      scale: the scale, scale > 0.

    Returns:
      log f(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import beta
    >>> float(jax.grad(beta.logpdf)(0.0, 1.0, 2.0)), float(jax.grad(beta.logpdf)(1.0, 2.0, 1.0))
    (-1.0, 1.0)

    See also: `beta_pdf`, `jax.scipy.stats.beta.logpdf`.
    """
    x, a, b, loc, scale = _promote("beta.logpdf", x, a, b, loc, scale)
    y = (x - loc) / scale
    log_linear = xlogy(a - 1, y) + xlog1py(b - 1, -y)
    log_probs = -_betaln(a, b) + log_linear - jnp.log(scale)
    out = jnp.where((x > loc + scale) | (x < loc), -jnp.inf, log_probs)
    return jnp.where((a <= 0) | (b <= 0) | (scale <= 0), jnp.nan, out)


def beta_pdf(x, a, b, loc=0, scale=1):
    """Density of the beta distribution, exp(`beta_logpdf`), with its boundary gradients.

    Args:
      x, a, b, loc, scale: as `beta_logpdf`.

    Returns:
      f(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import beta
    >>> round(float(jax.grad(beta.pdf)(0.0, 1.0, 2.0)), 12)
    -2.0

    See also: `beta_logpdf`, `jax.scipy.stats.beta.pdf`.
    """
    return jnp.exp(beta_logpdf(x, a, b, loc, scale))


beta = SimpleNamespace(logpdf=beta_logpdf, pdf=beta_pdf)


# ----- log_gauss_mass: log(Phi(b) - Phi(a)) ---------------------------------------------------
def _log1mexp(d):
    """log(1 - e^d) for d <= 0 (Maechler's two branches, each kept finite where unselected)."""
    near = d > -math.log(2.0)
    dn = jnp.where(near, d, -jnp.ones_like(d))
    df = jnp.where(near, -jnp.ones_like(d), d)
    return jnp.where(near, jnp.log(-jnp.expm1(dn)), jnp.log1p(-jnp.exp(df)))


@primitive
def log_gauss_mass(a, b):
    """log(Phi(b) - Phi(a)), the standard normal's mass on [a, b], stable in both tails.

    Why a rule: in a tail both Phi's round to 0 or 1; the value is computed as
    log_ndtr(b') + log(1 - exp(log_ndtr(a') - log_ndtr(b'))) on the bounds reflected into the
    left tail, and the derivatives -phi(a) / (Phi(b) - Phi(a)) and phi(b) / (Phi(b) - Phi(a))
    as exp(log phi - value), finite where JAX's gradient of its `truncnorm` is NaN (a = 10).

    Args:
      a: the lower bound.
      b: the upper bound, b > a.

    Returns:
      log(Phi(b) - Phi(a)), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import log_gauss_mass
    >>> round(float(log_gauss_mass(10.0, 11.0)), 6), round(float(jax.grad(log_gauss_mass)(10.0, 11.0)), 6)
    (-53.23131, -10.098346)

    See also: `truncnorm_logpdf`, `jax.scipy.special.log_ndtr`.
    """
    a, b = _promote("log_gauss_mass", a, b)
    a, b = jnp.broadcast_arrays(a, b)
    right = a > 0
    central = ~((b <= 0) | right)
    lo, hi = jnp.where(right, -b, a), jnp.where(right, -a, b)
    log_hi, log_lo = jsp.log_ndtr(hi), jsp.log_ndtr(lo)
    tail = log_hi + _log1mexp(log_lo - log_hi)
    ac, bc = jnp.where(central, a, -jnp.ones_like(a)), jnp.where(central, b, jnp.ones_like(b))
    centre = jnp.log1p(-jsp.ndtr(ac) - jsp.ndtr(-bc))
    return jnp.where(central, centre, tail)


def _log_phi(x):
    return -x * x / 2 - _LOG_SQRT_2PI


scalar_rule(
    log_gauss_mass,
    lambda a, b, y: (-jnp.exp(_log_phi(jnp.asarray(a, y.dtype)) - y), jnp.exp(_log_phi(jnp.asarray(b, y.dtype)) - y)),
    examples=[
        (np.array([-1.0, 0.5, 10.0, -12.0]), np.array([0.5, 2.0, 11.0, -11.0])),
        (np.array([-0.5, 3.0], np.float32), np.array([1.0, 4.0], np.float32)),
    ],
)


# ----- truncnorm ------------------------------------------------------------------------------
def truncnorm_logpdf(x, a, b, loc=0, scale=1):
    """Log-density of the truncated normal: `jax.scipy.stats.truncnorm.logpdf` with finite,
    right gradients in the tails.

    Why: the normaliser is `log_gauss_mass`, so d/da at a = 10 is phi(a) / (Phi(b) - Phi(a))
    (about 10.1 for b = 11), where JAX's is NaN.

    Args:
      x: where to evaluate; -inf outside [a, b] (in standard units).
      a, b: the bounds in standard units, a < b (NaN otherwise, as JAX).
      loc: the mean of the untruncated normal.
      scale: its standard deviation.

    Returns:
      log f(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import truncnorm
    >>> round(float(jax.grad(truncnorm.logpdf, argnums=1)(10.5, 10.0, 11.0)), 6)
    10.098346

    See also: `truncnorm_pdf`, `truncnorm_logcdf`, `log_gauss_mass`.
    """
    x, a, b, loc, scale = _promote("truncnorm.logpdf", x, a, b, loc, scale)
    val = _norm.logpdf(x, loc, scale) - log_gauss_mass(a, b)
    z = (x - loc) / scale
    val = jnp.where((z < a) | (z > b), -jnp.inf, val)
    return jnp.where(a < b, val, jnp.nan)


def truncnorm_pdf(x, a, b, loc=0, scale=1):
    """Density of the truncated normal, exp(`truncnorm_logpdf`).

    Args:
      x, a, b, loc, scale: as `truncnorm_logpdf`.

    Returns:
      f(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import truncnorm
    >>> bool(jax.numpy.isfinite(jax.grad(truncnorm.pdf, argnums=1)(10.5, 10.0, 11.0)))
    True

    See also: `truncnorm_logpdf`, `jax.scipy.stats.truncnorm.pdf`.
    """
    return jnp.exp(truncnorm_logpdf(x, a, b, loc, scale))


def truncnorm_logcdf(x, a, b, loc=0, scale=1):
    """Log-CDF of the truncated normal: `jax.scipy.stats.truncnorm.logcdf` with finite
    gradients in the tails.

    Why: log(Phi(z) - Phi(a)) - log(Phi(b) - Phi(a)) from `log_gauss_mass`, and log(1 - sf)
    near 1 with its argument kept finite where unselected, so d/da at a = 10 is finite where
    JAX's is NaN.

    Args:
      x, a, b, loc, scale: as `truncnorm_logpdf`.

    Returns:
      log F(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import truncnorm
    >>> bool(jax.numpy.isfinite(jax.grad(truncnorm.logcdf, argnums=1)(10.5, 10.0, 11.0)))
    True

    See also: `truncnorm_cdf`, `jax.scipy.stats.truncnorm.logcdf`.
    """
    x, a, b, loc, scale = _promote("truncnorm.logcdf", x, a, b, loc, scale)
    x, a, b = jnp.broadcast_arrays(x, a, b)
    z = (x - loc) / scale
    inside = (z > a) & (z < b)
    zi = jnp.where(inside, z, (a + b) / 2)  # the masses below are finite where z is outside
    mass = log_gauss_mass(a, b)
    log_cdf = log_gauss_mass(a, zi) - mass
    log_sf = log_gauss_mass(zi, b) - mass
    upper = log_cdf > -0.1
    near_one = jnp.log1p(-jnp.exp(jnp.where(upper, log_sf, -jnp.ones_like(log_sf))))
    out = jnp.select([z >= b, z <= a, upper], [jnp.zeros_like(z), jnp.full_like(z, -jnp.inf), near_one], log_cdf)
    return jnp.where(a < b, out, jnp.nan)


def truncnorm_cdf(x, a, b, loc=0, scale=1):
    """CDF of the truncated normal, exp(`truncnorm_logcdf`).

    Args:
      x, a, b, loc, scale: as `truncnorm_logpdf`.

    Returns:
      F(x), broadcast shape, promoted floating dtype.

    >>> from rules.library.stats import truncnorm
    >>> round(float(truncnorm.cdf(0.0, -1.0, 1.0)), 12)
    0.5

    See also: `truncnorm_logcdf`, `jax.scipy.stats.truncnorm.cdf`.
    """
    return jnp.exp(truncnorm_logcdf(x, a, b, loc, scale))


truncnorm = SimpleNamespace(logpdf=truncnorm_logpdf, pdf=truncnorm_pdf, logcdf=truncnorm_logcdf, cdf=truncnorm_cdf)
