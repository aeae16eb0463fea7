"""The discrete distributions of `rules.library.stats` (poisson, binom, bernoulli, geom,
nbinom, betabinom, multinomial), and the helpers both halves share; see `rules.library.stats`."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp

from .._errors import format_message
from .logexp import xlog1py, xlogy
from .special_jax import _betaln  # jax.scipy.special.betaln by its rule: JAX 0.10's Hessian is wrong


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


# ----- betabinom ------------------------------------------------------------------------------
def betabinom_logpmf(k, n, a, b, loc=0):
    """Log-mass of the beta-binomial distribution: `jax.scipy.stats.betabinom.logpmf`, its
    log-Beta terms by `jax.scipy.special.betaln`'s rule (`rules.library.special_jax`).

    Why: d/da is a difference of digammas, and every higher derivative of polygammas; JAX 0.10
    differentiates its own series for log B, whose second derivatives are 100-200% off where
    the two shapes are equal (a = b, also inside: y + a = n - y + b).

    Args:
      k: the number of successes; -inf outside {loc, ..., loc + n} (a non-integer k - loc too).
      n: the number of trials, n >= 0.
      a, b: the shapes, > 0 (NaN otherwise, as JAX).
      loc: the offset.

    Returns:
      log P(k), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.stats import betabinom
    >>> round(float(jax.hessian(betabinom.logpmf, argnums=2)(1.0, 2.0, 1.0, 1.0)), 12)  # -23/36 (JAX 0.10: -5/36)
    -0.638888888889

    See also: `betabinom_pmf`, `jax.scipy.stats.betabinom.logpmf`.
    """
    k, n, a, b, loc = _promote("betabinom.logpmf", k, n, a, b, loc)
    y = k - loc
    log_probs = -(jnp.log1p(n) + _betaln(n - y + 1, y + 1)) + (_betaln(y + a, n - y + b) - _betaln(a, b))
    log_probs = jnp.where((y == 0) & (n == 0), 0.0, log_probs)
    log_probs = jnp.where((y < 0) | (y > n) | (jnp.round(y) != y), -jnp.inf, log_probs)
    return jnp.where((n < 0) | (a <= 0) | (b <= 0), jnp.nan, log_probs)


def betabinom_pmf(k, n, a, b, loc=0):
    """Mass of the beta-binomial distribution, exp(`betabinom_logpmf`).

    Args:
      k, n, a, b, loc: as `betabinom_logpmf`.

    Returns:
      P(k), broadcast shape, promoted floating dtype.

    >>> from rules.library.stats import betabinom
    >>> round(float(betabinom.pmf(1.0, 2.0, 1.0, 1.0)), 12)  # uniform on {0, 1, 2}
    0.333333333333

    See also: `betabinom_logpmf`, `jax.scipy.stats.betabinom.pmf`.
    """
    return jnp.exp(betabinom_logpmf(k, n, a, b, loc))


betabinom = SimpleNamespace(logpmf=betabinom_logpmf, pmf=betabinom_pmf)


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
