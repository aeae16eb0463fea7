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
`geom`, `nbinom`, `multinomial` (logpmf, pmf) and `truncnorm` (logpdf, pdf, logcdf, cdf).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
from jax.scipy.stats import norm as _norm

from .._errors import format_message
from .._helpers import scalar_rule
from .._primitive import primitive
from .logexp import xlog1py, xlogy

__all__ = [
    "gamma", "chi2", "beta", "poisson", "binom", "bernoulli", "geom", "nbinom", "multinomial", "truncnorm",
    "log_gauss_mass",
]

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _promote(name: str, *args: Any) -> list:
    """The arguments as arrays of their promoted real floating dtype (ints -> float)."""
    dtype = jnp.result_type(float, *args)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        raise TypeError(
            format_message(
                f"`rules.library.stats.{name}`: complex arguments are not supported",
                expected="real floating or integer arguments",
                got=f"dtype {dtype}",
                fix="pass real arrays",
            )
        )
    return [jnp.asarray(a, dtype) for a in args]


def _forced_zero(cond: Any, value: Any) -> Any:
    """`value` set to exactly 0 where `cond` holds, its derivative kept (value - value, with
    the second one's gradient stopped): where JAX forces a value it knows, not its slope."""
    return jnp.where(cond, value - jax.lax.stop_gradient(value), value)


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
    log_probs = -jsp.betaln(a, b) + log_linear - jnp.log(scale)
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


# ----- poisson --------------------------------------------------------------------------------
def poisson_logpmf(k, mu, loc=0):
    """Log-mass of the Poisson distribution: `jax.scipy.stats.poisson.logpmf` with the right
    gradient at mu = 0.

    Why: k log mu is `xlogy`, so at k = 0, mu = 0 d/dmu is -1 (log P(0) = -mu), where JAX's
    is NaN.

    Args:
      k: the count; -inf where k - loc is negative or not an integer.
      mu: the rate, mu >= 0.
      loc: the offset.

    Returns:
      log P(k), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import poisson
    >>> float(jax.grad(poisson.logpmf, argnums=1)(0.0, 0.0))
    -1.0

    See also: `poisson_pmf`, `jax.scipy.stats.poisson.logpmf`.
    """
    k, mu, loc = _promote("poisson.logpmf", k, mu, loc)
    x = k - loc
    log_probs = xlogy(x, mu) - jsp.gammaln(x + 1) - mu
    return jnp.where((x < 0) | (jnp.round(x) != x), -jnp.inf, log_probs)


def poisson_pmf(k, mu, loc=0):
    """Mass of the Poisson distribution, exp(`poisson_logpmf`): d/dmu at k = 0, mu = 0 is -1.

    Args:
      k, mu, loc: as `poisson_logpmf`.

    Returns:
      P(k), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import poisson
    >>> float(jax.grad(poisson.pmf, argnums=1)(0.0, 0.0))
    -1.0

    See also: `poisson_logpmf`, `jax.scipy.stats.poisson.pmf`.
    """
    return jnp.exp(poisson_logpmf(k, mu, loc))


poisson = SimpleNamespace(logpmf=poisson_logpmf, pmf=poisson_pmf)


# ----- binom ----------------------------------------------------------------------------------
def binom_logpmf(k, n, p, loc=0):
    """Log-mass of the binomial distribution: `jax.scipy.stats.binom.logpmf` with the right
    gradients at p = 0 and p = 1.

    Why: k log p + (n - k) log(1 - p) are `xlogy` / `xlog1py`, so d/dp is -n at k = 0, p = 0
    and n at k = n, p = 1, where JAX's are NaN. Where JAX sets the value to exactly 0 (k = n = 0,
    or a zero log-linear term) the value is 0 here too, but its derivative is kept.

    Args:
      k: the number of successes; -inf outside [loc, loc + n].
      n: the number of trials.
      p: the success probability, 0 <= p <= 1.
      loc: the offset.

    Returns:
      log P(k), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import binom
    >>> float(jax.grad(binom.logpmf, argnums=2)(0.0, 3.0, 0.0)), float(jax.grad(binom.logpmf, argnums=2)(3.0, 3.0, 1.0))
    (-3.0, 3.0)

    See also: `binom_pmf`, `jax.scipy.stats.binom.logpmf`.
    """
    k, n, p, loc = _promote("binom.logpmf", k, n, p, loc)
    y = k - loc
    comb = jsp.gammaln(n + 1) - (jsp.gammaln(y + 1) + jsp.gammaln(n - y + 1))
    log_linear = xlogy(y, p) + xlog1py(n - y, -p)
    log_probs = _forced_zero(((y == 0) & (n == 0)) | (log_linear == 0), comb + log_linear)
    return jnp.where((k >= loc) & (k < loc + n + 1), log_probs, -jnp.inf)


def binom_pmf(k, n, p, loc=0):
    """Mass of the binomial distribution, exp(`binom_logpmf`), with its boundary gradients.

    Args:
      k, n, p, loc: as `binom_logpmf`.

    Returns:
      P(k), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import binom
    >>> float(jax.grad(binom.pmf, argnums=2)(0.0, 3.0, 0.0))
    -3.0

    See also: `binom_logpmf`, `jax.scipy.stats.binom.pmf`.
    """
    return jnp.exp(binom_logpmf(k, n, p, loc))


binom = SimpleNamespace(logpmf=binom_logpmf, pmf=binom_pmf)


# ----- bernoulli ------------------------------------------------------------------------------
def bernoulli_logpmf(k, p, loc=0):
    """Log-mass of the Bernoulli distribution: `jax.scipy.stats.bernoulli.logpmf` with the
    right gradients at p = 0 and p = 1.

    Why: k log p + (1 - k) log(1 - p) are `xlogy` / `xlog1py`: d/dp is -1 at k = 0, p = 0 and
    1 at k = 1, p = 1, where JAX's are NaN.

    Args:
      k: the outcome, 0 or 1 (after `loc`); -inf otherwise.
      p: the success probability.
      loc: the offset.

    Returns:
      log P(k), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import bernoulli
    >>> float(jax.grad(bernoulli.logpmf, argnums=1)(0.0, 0.0)), float(jax.grad(bernoulli.logpmf, argnums=1)(1.0, 1.0))
    (-1.0, 1.0)

    See also: `bernoulli_pmf`, `jax.scipy.stats.bernoulli.logpmf`.
    """
    k, p, loc = _promote("bernoulli.logpmf", k, p, loc)
    x = k - loc
    log_probs = xlogy(x, p) + xlog1py(1 - x, -p)
    return jnp.where((x < 0) | (x > 1), -jnp.inf, log_probs)


def bernoulli_pmf(k, p, loc=0):
    """Mass of the Bernoulli distribution, exp(`bernoulli_logpmf`).

    Args:
      k, p, loc: as `bernoulli_logpmf`.

    Returns:
      P(k), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import bernoulli
    >>> float(jax.grad(bernoulli.pmf, argnums=1)(1.0, 1.0))
    1.0

    See also: `bernoulli_logpmf`, `jax.scipy.stats.bernoulli.pmf`.
    """
    return jnp.exp(bernoulli_logpmf(k, p, loc))


bernoulli = SimpleNamespace(logpmf=bernoulli_logpmf, pmf=bernoulli_pmf)


# ----- geom -----------------------------------------------------------------------------------
def geom_logpmf(k, p, loc=0):
    """Log-mass of the geometric distribution: `jax.scipy.stats.geom.logpmf` with the right
    gradient at p = 1.

    Why: (k - 1) log(1 - p) is `xlog1py`, so at k = 1, p = 1 d/dp is 1/p = 1, where JAX's is NaN.

    Args:
      k: the trial of the first success, k >= 1 (after `loc`); -inf otherwise.
      p: the success probability, 0 < p <= 1.
      loc: the offset.

    Returns:
      log P(k), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import geom
    >>> float(jax.grad(geom.logpmf, argnums=1)(1.0, 1.0))
    1.0

    See also: `geom_pmf`, `jax.scipy.stats.geom.logpmf`.
    """
    k, p, loc = _promote("geom.logpmf", k, p, loc)
    x = k - loc
    log_probs = xlog1py(x - 1, -p) + jnp.log(p)
    return jnp.where(x <= 0, -jnp.inf, log_probs)


def geom_pmf(k, p, loc=0):
    """Mass of the geometric distribution, exp(`geom_logpmf`).

    Args:
      k, p, loc: as `geom_logpmf`.

    Returns:
      P(k), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import geom
    >>> float(jax.grad(geom.pmf, argnums=1)(1.0, 1.0))
    1.0

    See also: `geom_logpmf`, `jax.scipy.stats.geom.pmf`.
    """
    return jnp.exp(geom_logpmf(k, p, loc))


geom = SimpleNamespace(logpmf=geom_logpmf, pmf=geom_pmf)


# ----- nbinom ---------------------------------------------------------------------------------
def nbinom_logpmf(k, n, p, loc=0):
    """Log-mass of the negative binomial distribution: `jax.scipy.stats.nbinom.logpmf` with
    the right gradient at p = 1.

    Why: n log p + k log(1 - p) are `xlogy`s, so at k = 0, p = 1 d/dp is n / p = n, where JAX's
    is NaN. (At p = 0 the mass is 0 for every k, log-mass -inf: there is no finite slope.)

    Args:
      k: the number of failures; -inf below `loc`.
      n: the number of successes, n > 0.
      p: the success probability, 0 < p <= 1.
      loc: the offset.

    Returns:
      log P(k), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import nbinom
    >>> float(jax.grad(nbinom.logpmf, argnums=2)(0.0, 2.0, 1.0))
    2.0

    See also: `nbinom_pmf`, `jax.scipy.stats.nbinom.logpmf`.
    """
    k, n, p, loc = _promote("nbinom.logpmf", k, n, p, loc)
    y = k - loc
    comb = jsp.gammaln(y + n) - jsp.gammaln(n) - jsp.gammaln(y + 1)
    log_probs = comb + (xlogy(n, p) + xlogy(y, 1 - p))
    return jnp.where(k < loc, -jnp.inf, log_probs)


def nbinom_pmf(k, n, p, loc=0):
    """Mass of the negative binomial distribution, exp(`nbinom_logpmf`).

    Args:
      k, n, p, loc: as `nbinom_logpmf`.

    Returns:
      P(k), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import nbinom
    >>> float(jax.grad(nbinom.pmf, argnums=2)(0.0, 2.0, 1.0))
    2.0

    See also: `nbinom_logpmf`, `jax.scipy.stats.nbinom.pmf`.
    """
    return jnp.exp(nbinom_logpmf(k, n, p, loc))


nbinom = SimpleNamespace(logpmf=nbinom_logpmf, pmf=nbinom_pmf)


# ----- multinomial ----------------------------------------------------------------------------
def multinomial_logpmf(x, n, p):
    """Log-mass of the multinomial distribution: `jax.scipy.stats.multinomial.logpmf` with the
    right gradient where a p_i = 0 has x_i = 0.

    Why: x_i log p_i is `xlogy`, so d/dp_i is 0 where x_i = 0 (also at p_i = 0), where JAX's
    is NaN there.

    Args:
      x: the counts, integers, categories on the last axis.
      n: the number of trials, an integer; -inf where the counts do not sum to it.
      p: the category probabilities, on the last axis.

    Returns:
      log P(x), shape of x without its last axis, floating dtype of `p`.

    Raises:
      ValueError: `x` or `n` is not of integer type (as JAX).

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.stats import multinomial
    >>> jax.grad(multinomial.logpmf, argnums=2)(jnp.array([1, 0]), 1, jnp.array([0.5, 0.0])).tolist()
    [2.0, 0.0]

    See also: `multinomial_pmf`, `jax.scipy.stats.multinomial.logpmf`.
    """
    (p,) = _promote("multinomial.logpmf", p)
    x, n = jnp.asarray(x), jnp.asarray(n)
    if not (jnp.issubdtype(x.dtype, jnp.integer) and jnp.issubdtype(n.dtype, jnp.integer)):
        raise ValueError(
            format_message(
                "`rules.library.stats.multinomial.logpmf`: the counts x and the trials n must be integers",
                expected="integer arrays x and n",
                got=f"x.dtype={x.dtype}, n.dtype={n.dtype}",
                fix="pass counts as integers, e.g. `x.astype(int)`",
            )
        )
    in_support = jnp.sum(x, axis=-1) == n
    x, n = x.astype(p.dtype), n.astype(p.dtype)
    log_probs = jsp.gammaln(n + 1) + jnp.sum(xlogy(x, p) - jsp.gammaln(x + 1), axis=-1)
    return jnp.where(in_support, log_probs, -jnp.inf)


def multinomial_pmf(x, n, p):
    """Mass of the multinomial distribution, exp(`multinomial_logpmf`).

    Args:
      x, n, p: as `multinomial_logpmf`.

    Returns:
      P(x), shape of x without its last axis, floating dtype of `p`.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.stats import multinomial
    >>> jax.grad(multinomial.pmf, argnums=2)(jnp.array([1, 0]), 1, jnp.array([0.5, 0.0])).tolist()
    [1.0, 0.0]

    See also: `multinomial_logpmf`, `jax.scipy.stats.multinomial.pmf`.
    """
    return jnp.exp(multinomial_logpmf(x, n, p))


multinomial = SimpleNamespace(logpmf=multinomial_logpmf, pmf=multinomial_pmf)


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
