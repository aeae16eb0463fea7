"""rules.library.stats: jax.scipy.stats' log-densities, right at their boundaries, JAX's elsewhere."""

import inspect
import math

import jax
import jax.numpy as jnp
import jax.scipy.stats as jst
import numpy as np
import pytest
import scipy.special as ss

from rules.library import stats
from rules.testing import test_rrule


def test_the_module_ships_its_rules(shipped):
    assert "log_gauss_mass" in shipped("stats")


NAMES = [
    ("gamma", "logpdf"), ("gamma", "pdf"), ("chi2", "logpdf"), ("chi2", "pdf"), ("beta", "logpdf"), ("beta", "pdf"),
    ("poisson", "logpmf"), ("poisson", "pmf"), ("binom", "logpmf"), ("binom", "pmf"), ("bernoulli", "logpmf"),
    ("bernoulli", "pmf"), ("geom", "logpmf"), ("geom", "pmf"), ("nbinom", "logpmf"), ("nbinom", "pmf"),
    ("multinomial", "logpmf"), ("multinomial", "pmf"), ("truncnorm", "logpdf"), ("truncnorm", "pdf"),
    ("truncnorm", "logcdf"), ("truncnorm", "cdf"),
]


@pytest.mark.parametrize("family, name", NAMES, ids=[f"{f}.{n}" for f, n in NAMES])
def test_signatures_are_jaxs(family, name):
    ours = inspect.signature(getattr(getattr(stats, family), name))
    theirs = inspect.signature(getattr(getattr(jst, family), name))
    assert [(p.name, p.default) for p in ours.parameters.values()] == [
        (p.name, p.default) for p in theirs.parameters.values()
    ]


# ----- the boundaries: (plain JAX, ours, true) -------------------------------------------------
# Each row: function, the argument differentiated, the arguments, the true derivative and its
# derivation. Plain JAX's gradient is NaN at every one of them (asserted below).
EDGES = [
    # gamma: a = 1 is the exponential density e^(-x/s)/s: log f = -x/s - log s, d/dx = -1/s
    ("gamma", "logpdf", 0, (0.0, 1.0, 0.0, 2.0), -0.5),
    ("gamma", "pdf", 0, (0.0, 1.0), -1.0),  # d/dx e^-x = -1 at 0
    # chi2, df = 2: f = e^(-x/2) / 2, log f = -x/2 - log 2, d/dx = -1/2; f' = -1/4 at 0
    ("chi2", "logpdf", 0, (0.0, 2.0), -0.5),
    ("chi2", "pdf", 0, (0.0, 2.0), -0.25),
    # beta(1, 2): f = 2 (1 - x), log f' = -1/(1 - x) = -1 at 0; f' = -2
    ("beta", "logpdf", 0, (0.0, 1.0, 2.0), -1.0),
    ("beta", "pdf", 0, (0.0, 1.0, 2.0), -2.0),
    # beta(2, 1): f = 2 x, log f' = 1/x = 1 at 1; f' = 2
    ("beta", "logpdf", 0, (1.0, 2.0, 1.0), 1.0),
    ("beta", "pdf", 0, (1.0, 2.0, 1.0), 2.0),
    # poisson, k = 0: P = e^-mu, log P = -mu, d/dmu = -1; P' = -1 at mu = 0
    ("poisson", "logpmf", 1, (0.0, 0.0), -1.0),
    ("poisson", "pmf", 1, (0.0, 0.0), -1.0),
    # binom, k = 0: P = (1 - p)^n, d/dp log P = -n/(1 - p) = -3 at p = 0; k = n: P = p^n, n/p = 3 at 1
    ("binom", "logpmf", 2, (0.0, 3.0, 0.0), -3.0),
    ("binom", "logpmf", 2, (3.0, 3.0, 1.0), 3.0),
    ("binom", "pmf", 2, (0.0, 3.0, 0.0), -3.0),
    # bernoulli: log P(0) = log(1 - p), -1 at p = 0; log P(1) = log p, 1 at p = 1
    ("bernoulli", "logpmf", 1, (0.0, 0.0), -1.0),
    ("bernoulli", "logpmf", 1, (1.0, 1.0), 1.0),
    # geom, k = 1: P = p, d/dp log P = 1/p = 1 at p = 1
    ("geom", "logpmf", 1, (1.0, 1.0), 1.0),
    ("geom", "pmf", 1, (1.0, 1.0), 1.0),
    # nbinom, k = 0: P = p^n, d/dp log P = n/p = 2 at p = 1 (n = 2)
    ("nbinom", "logpmf", 2, (0.0, 2.0, 1.0), 2.0),
    ("nbinom", "pmf", 2, (0.0, 2.0, 1.0), 2.0),
]


@pytest.mark.parametrize("family, name, k, args, truth", EDGES, ids=[f"{e[0]}.{e[1]}{e[3]}" for e in EDGES])
def test_boundary_gradient_is_right_where_jax_gives_nan(family, name, k, args, truth, maybe_jit):
    plain = float(maybe_jit(jax.grad(getattr(getattr(jst, family), name), argnums=k))(*args))
    ours = float(maybe_jit(jax.grad(getattr(getattr(stats, family), name), argnums=k))(*args))
    assert np.isnan(plain)
    assert ours == pytest.approx(truth, rel=1e-14, abs=1e-15)


@pytest.mark.parametrize("family, name, k, args, truth", EDGES[::2], ids=[f"{e[0]}.{e[1]}" for e in EDGES[::2]])
def test_boundary_values_are_jaxs(family, name, k, args, truth):
    # chi2 at x = 0 is the exception: JAX 0.10.2 gives NaN (log 0 * 0), JAX 0.12 and we -log 2
    ours = float(getattr(getattr(stats, family), name)(*args))
    plain = float(getattr(getattr(jst, family), name)(*args))
    if family == "chi2":
        assert ours == pytest.approx(-math.log(2.0) if name == "logpdf" else 0.5, rel=1e-15)
        assert np.isnan(plain) or plain == pytest.approx(ours, rel=1e-15)
    else:
        assert ours == pytest.approx(plain, rel=1e-14, abs=1e-15)


def test_multinomial_gradient_where_a_probability_and_its_count_are_zero(maybe_jit):
    # log P = log n! + sum_i (x_i log p_i - log x_i!); d/dp_i = x_i / p_i, and 0 where x_i = 0:
    # true gradient [2 / 0.5, 0] = [4, 0] for x = [2, 0], p = [0.5, 0]
    x, p = jnp.array([2, 0]), jnp.array([0.5, 0.0])
    plain = maybe_jit(jax.grad(jst.multinomial.logpmf, argnums=2))(x, 2, p)
    ours = maybe_jit(jax.grad(stats.multinomial.logpmf, argnums=2))(x, 2, p)
    assert np.isnan(float(plain[1]))
    np.testing.assert_array_equal(ours, [4.0, 0.0])
    assert float(stats.multinomial.logpmf(x, 2, p)) == float(jst.multinomial.logpmf(x, 2, p)) == pytest.approx(
        math.log(0.25), rel=1e-15
    )
    with pytest.raises(ValueError, match="multinomial.*integer"):
        stats.multinomial.logpmf(jnp.array([2.0, 0.0]), 2, p)


def _log_mass(a, b):
    """log(Phi(b) - Phi(a)) for 0 < a < b, in SciPy: Phi(b) - Phi(a) = Phi(-a) - Phi(-b)."""
    return math.log(ss.ndtr(-a) - ss.ndtr(-b))


def _phi(x):
    return math.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def test_truncnorm_gradient_in_the_bound_is_finite_and_right_at_a_10(maybe_jit):
    # logpdf = log phi(x) - log(Phi(b) - Phi(a)): d/da = phi(a) / (Phi(b) - Phi(a)), with SciPy's
    # ndtr(-10) = 7.62e-24, ndtr(-11) = 1.91e-28: 10.0983464475...
    a, b, x = 10.0, 11.0, 10.5
    truth_a = _phi(a) / math.exp(_log_mass(a, b))
    truth_b = -_phi(b) / math.exp(_log_mass(a, b))
    plain = maybe_jit(jax.grad(jst.truncnorm.logpdf, argnums=(1, 2)))(x, a, b)
    ours = maybe_jit(jax.grad(stats.truncnorm.logpdf, argnums=(1, 2)))(x, a, b)
    assert np.isnan(float(plain[0]))
    assert float(ours[0]) == pytest.approx(truth_a, rel=1e-12)
    assert float(ours[1]) == pytest.approx(truth_b, rel=1e-10, abs=0)
    assert float(stats.truncnorm.logpdf(x, a, b)) == pytest.approx(float(jst.truncnorm.logpdf(x, a, b)), rel=1e-13)


def test_truncnorm_logcdf_gradient_at_a_10():
    # logcdf = log(Phi(x) - Phi(a)) - log(Phi(b) - Phi(a)):
    # d/da = -phi(a) / (Phi(x) - Phi(a)) + phi(a) / (Phi(b) - Phi(a))
    a, b, x = 10.0, 11.0, 10.5
    truth = -_phi(a) / math.exp(_log_mass(a, x)) + _phi(a) / math.exp(_log_mass(a, b))
    assert np.isnan(float(jax.grad(jst.truncnorm.logcdf, argnums=1)(x, a, b)))
    assert float(jax.grad(stats.truncnorm.logcdf, argnums=1)(x, a, b)) == pytest.approx(truth, rel=1e-10, abs=0)
    assert float(stats.truncnorm.logcdf(x, a, b)) == pytest.approx(
        math.log(ss.ndtr(-a) - ss.ndtr(-x)) - _log_mass(a, b), rel=1e-12
    )


# ----- ordinary points: JAX's value and gradient ------------------------------------------------
ORDINARY = [
    ("gamma", "logpdf", (1.3, 2.5, 0.2, 1.7)), ("gamma", "pdf", (1.3, 2.5)),
    ("chi2", "logpdf", (1.3, 3.0, 0.1, 2.0)), ("chi2", "pdf", (1.3, 3.0)),
    ("beta", "logpdf", (0.3, 2.0, 3.5)), ("beta", "pdf", (0.3, 2.0, 3.5, -0.1, 1.5)),
    ("poisson", "logpmf", (3.0, 2.5)), ("poisson", "pmf", (3.0, 2.5)),
    ("binom", "logpmf", (2.0, 5.0, 0.3)), ("binom", "pmf", (2.0, 5.0, 0.3)),
    ("bernoulli", "logpmf", (1.0, 0.3)), ("bernoulli", "pmf", (0.0, 0.3)),
    ("geom", "logpmf", (3.0, 0.3)), ("geom", "pmf", (3.0, 0.3)),
    ("nbinom", "logpmf", (2.0, 3.5, 0.4)), ("nbinom", "pmf", (2.0, 3.5, 0.4)),
    ("truncnorm", "logpdf", (0.3, -0.5, 2.0, 0.1, 1.3)), ("truncnorm", "pdf", (0.3, -0.5, 2.0)),
    ("truncnorm", "logcdf", (0.3, -0.5, 2.0)), ("truncnorm", "cdf", (1.7, 1.0, 3.0)),
]


@pytest.mark.parametrize("family, name, args", ORDINARY, ids=[f"{o[0]}.{o[1]}" for o in ORDINARY])
def test_ordinary_points_agree_with_jax(family, name, args):
    ours, plain = getattr(getattr(stats, family), name), getattr(getattr(jst, family), name)
    np.testing.assert_allclose(ours(*args), plain(*args), rtol=1e-13)
    float_args = tuple(range(len(args)))
    np.testing.assert_allclose(jax.grad(ours, argnums=float_args)(*args), jax.grad(plain, argnums=float_args)(*args),
                               rtol=1e-10, atol=1e-14)


def test_multinomial_at_an_ordinary_point_agrees_with_jax():
    x, p = jnp.array([1, 2, 0]), jnp.array([0.2, 0.5, 0.3])
    np.testing.assert_allclose(stats.multinomial.logpmf(x, 3, p), jst.multinomial.logpmf(x, 3, p), rtol=1e-14)
    grad = lambda f: jax.grad(lambda p: f(x, 3, p))(p)  # noqa: E731
    np.testing.assert_allclose(grad(stats.multinomial.pmf), grad(jst.multinomial.pmf), rtol=1e-13)
    # a batch of counts: one log-mass per row (JAX 0.10.2 summed all counts for the support test)
    batch = jnp.stack([x, jnp.array([0, 1, 2])])
    np.testing.assert_allclose(stats.multinomial.logpmf(batch, 3, p[None]),
                               [jst.multinomial.logpmf(row, 3, p) for row in batch], rtol=1e-14)


def test_arrays_float32_and_vmap():
    x = jnp.array([0.0, 0.5, 2.0], jnp.float32)
    y = stats.gamma.logpdf(x, jnp.float32(1.0))
    assert y.dtype == jnp.float32
    grads = jax.vmap(jax.grad(stats.gamma.logpdf), in_axes=(0, None))(x, jnp.float32(1.0))
    np.testing.assert_array_equal(grads, [-1.0, -1.0, -1.0])  # -1/scale everywhere, 0 included


def test_log_gauss_mass_passes_the_testers_in_both_tails():
    test_rrule(stats.log_gauss_mass, np.array([-12.0, -0.3, 9.0]), np.array([-11.0, 0.8, 9.5]))


# Mixed second derivatives at ordinary points (JAX right there): the densities inherit xlogy's
# partials, which held x / y at a constant 0 wherever x == 0 (a = 1, df = 2, a = b = 1, k = n).
MIXED = [
    ("gamma", "logpdf", (2.0, 1.0)), ("chi2", "logpdf", (2.0, 2.0)), ("beta", "logpdf", (0.3, 1.0, 1.0)),
    ("binom", "logpmf", (5.0, 5.0, 0.3)),
]


def _beta_logpdf_hessian(x, a, b):
    """(a - 1) log x + (b - 1) log(1 - x) - betaln(a, b) in (x, a, b), closed form: JAX's own
    Hessian of it compiles for ~5 s (polygammas of lgamma's derivatives)."""
    t = ss.polygamma(1, a + b)
    return [[-(a - 1) / x**2 - (b - 1) / (1 - x) ** 2, 1 / x, -1 / (1 - x)],
            [1 / x, t - ss.polygamma(1, a), t], [-1 / (1 - x), t, t - ss.polygamma(1, b)]]


@pytest.mark.parametrize("family, name, point", MIXED, ids=[f"{f}.{n}{p}" for f, n, p in MIXED])
def test_mixed_second_derivatives_at_ordinary_points_are_jaxs(family, name, point):
    argnums = tuple(range(len(point)))
    ours = jax.hessian(getattr(getattr(stats, family), name), argnums)(*point)
    plain = _beta_logpdf_hessian(*point) if family == "beta" else \
        jax.hessian(getattr(getattr(jst, family), name), argnums)(*point)
    np.testing.assert_allclose(np.array(ours), np.array(plain), rtol=1e-12, atol=1e-12)


def _betabinom_hessian(k, n, a, b):
    """log C(n, k) + betaln(k + a, n - k + b) - betaln(a, b) in (a, b), closed form (trigammas)."""
    t1, t0 = ss.polygamma(1, n + a + b), ss.polygamma(1, a + b)
    return np.array([[ss.polygamma(1, k + a) - t1 - ss.polygamma(1, a) + t0, t0 - t1],
                     [t0 - t1, ss.polygamma(1, n - k + b) - t1 - ss.polygamma(1, b) + t0]])


def test_betabinom_has_jax_values_and_the_true_hessian_in_its_shapes(maybe_jit, jax_010):
    """log B by betaln's rule: JAX 0.10's own Hessian of betabinom.logpmf is wrong where the
    shapes of a log B term are equal (a = b, or k + a = n - k + b); the values stay JAX's."""
    k, n = np.array([1.0, 0.0, 2.0, 1.0, 3.0]), np.array([2.0, 3.0, 4.0, 5.0, 3.0])
    a, b = np.array([1.0, 2.0, 0.5, 3.0, 1.5]), np.array([1.0, 2.0, 2.5, 0.7, 4.0])
    want = np.stack([_betabinom_hessian(*p) for p in zip(k, n, a, b)])
    hessian = lambda f: maybe_jit(jax.vmap(jax.hessian(f, argnums=(2, 3))))(k, n, a, b)  # noqa: E731
    np.testing.assert_allclose(np.array(hessian(stats.betabinom.logpmf)).transpose(2, 0, 1), want, rtol=1e-11)
    support = np.array([-1.0, 0.0, 2.0, 3.0, 4.0])  # -inf off the support
    for f in ("logpmf", "pmf"):
        got, expected = (getattr(d, f)(support, 3.0, 2.0, 1.5) for d in (stats.betabinom, jst.betabinom))
        np.testing.assert_allclose(got, expected, rtol=1e-14, atol=0)
    assert stats.betabinom.logpmf(1.5, 3.0, 2.0, 1.5) == -np.inf  # JAX 0.12's and SciPy's (0.10: k floored)
    np.testing.assert_array_equal(stats.betabinom.logpmf(0.0, 0.0, 2.0, 1.5), 0.0)  # k = n = 0
    assert np.isnan(stats.betabinom.logpmf(1.0, 3.0, -2.0, 1.5))  # a <= 0: NaN, as JAX
    if maybe_jit is jax.jit and jax_010:  # where JAX 0.10's own Hessian is wrong (0.12's is
        # right: test_special_jax's betaln test; its program here takes ~16 s to compile)
        plain = np.array(hessian(jst.betabinom.logpmf)).transpose(2, 0, 1)
        wrong = ~np.isclose(plain, want, rtol=1e-3).all(axis=(1, 2))
        assert wrong.tolist() == [True, True, False, False, False]  # log B at (1, 1) and (2, 2)
