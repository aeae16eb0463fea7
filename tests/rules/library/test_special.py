"""rules.library.special: SciPy functions as externals with frules, verified and compared with JAX."""

import decimal
import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import pytest
import scipy.special as ss

import rules
from rules import NoTangent
from rules.library import special
from rules.testing import test_frule, with_tangent

# Each function of x alone, with its other argument fixed at a non-integer value.
UNARY = {
    "kv": lambda x: special.kv(1.3, x),
    "kve": lambda x: special.kve(1.3, x),
    "iv": lambda x: special.iv(1.3, x),
    "ive": lambda x: special.ive(1.3, x),
    "jv": lambda x: special.jv(1.3, x),
    "yv": lambda x: special.yv(1.3, x),
    "struve": lambda x: special.struve(1.3, x),
    "gammaincc": lambda x: special.gammaincc(2.3, x),
    "expi": special.expi,
    "zeta": lambda q: special.zeta(2.5, q),
    "erfcx": special.erfcx,
    "spence": special.spence,
}
ORDERED = ["kv", "kve", "iv", "ive", "jv", "yv", "struve"]


def _fd(f, x, h=1e-3):
    """Five-point central difference of a scalar function (float64)."""
    f = lambda t, f=f: float(f(t))  # noqa: E731
    return (f(x - 2 * h) - 8 * f(x - h) + 8 * f(x + h) - f(x + 2 * h)) / (12 * h)


# ----- the module's functions (their examples are checked in test_every_example.py) --------
def test_the_module_ships_its_rules(shipped):
    names = shipped("special")
    assert set(special.__all__) <= names and len(names) >= 12


@pytest.mark.parametrize("name", ORDERED)
def test_non_integer_orders_match_finite_differences(name):
    # The examples use integer orders (non-differentiable to the core); the recurrences hold
    # for every real order, which is what this checks.
    v = np.array([0.5, 1.3, 2.7])
    x = np.array([0.6, 1.7, 2.9]) - (1.5 if name == "ive" else 0.0) * np.array([0, 0, 1])
    test_frule(getattr(special, name), with_tangent(v, NoTangent()), x, check_jit=False, check_vmap=False)


# ----- value added: what JAX lacks or gets wrong ------------------------------------------------
def test_jax_has_none_of_the_bessel_functions_of_real_order_nor_struve():
    x = jnp.array([0.6, 1.7, 2.9])
    for name in ORDERED:
        if name == "iv" and hasattr(jsp, "iv"):  # jax >= 0.12.1: of a static integer order only
            with pytest.raises(TypeError):
                jsp.iv(2.5, x)
            with pytest.raises(jax.errors.ConcretizationTypeError):
                jax.jit(jsp.iv)(2, x)
            np.testing.assert_allclose(jsp.iv(2, x), special.iv(2, x), rtol=1e-12)
            continue
        assert not hasattr(jsp, name), f"jax.scipy.special.{name} exists now: compare with it"
    # ... and what it has is of integer order only (bessel_jn(z, v=n); jn, kn, yn in 0.12.1)
    grads = jax.vmap(jax.grad(lambda x: special.jv(2.5, x)))(x)
    np.testing.assert_allclose(grads, (ss.jv(1.5, x) - ss.jv(3.5, x)) / 2, rtol=1e-12)


def test_scaled_bessel_functions_stay_finite_where_the_plain_ones_do_not():
    # K_v underflows and I_v overflows at large x; the scaled ones and their gradients do not
    # (von Mises-Fisher normalisers, Matern kernels).
    assert float(special.kv(2.5, 800.0)) == 0.0 and np.isinf(float(special.iv(2.5, 800.0)))
    for f in (special.kve, special.ive):
        y, dy = jax.value_and_grad(lambda x, f=f: f(2.5, x))(800.0)
        assert np.isfinite(float(y)) and float(y) > 0 and np.isfinite(float(dy)) and float(dy) != 0
        assert float(dy) == pytest.approx(_fd(lambda t, f=f: f(2.5, t), 800.0), rel=1e-6)


def test_gammaincc_slope_is_finite_at_zero_where_jax_gives_nan():
    assert np.isnan(float(jax.jit(jax.grad(jsp.gammaincc, argnums=1))(1.0, 0.0)))
    assert float(jax.grad(special.gammaincc, argnums=1)(1.0, 0.0)) == -1.0  # -e^{-x} at 0
    assert float(jax.grad(special.gammaincc, argnums=1)(2.0, 0.0)) == 0.0
    assert float(jax.grad(special.gammaincc, argnums=1)(0.5, 0.0)) == -np.inf


def test_gammaincc_agrees_with_jax_elsewhere():
    a = jnp.array([0.5, 1.0, 2.5, 30.0, 1e3])
    x = jnp.array([1e-3, 0.7, 2.0, 25.0, 1e3])
    ours = jax.vmap(jax.value_and_grad(special.gammaincc, argnums=1))(a, x)
    theirs = jax.jit(jax.vmap(jax.value_and_grad(jsp.gammaincc, argnums=1)))(a, x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)


def test_spence_slope_is_finite_on_1_to_2_where_jax_gives_zero_or_nan():
    x = jnp.array([1.0, 1.000001, 1.5, 2.0, 0.2, 0.9, 4.0])
    jax_value, jax_slope = jax.jit(jax.vmap(jax.value_and_grad(jsp.spence)))(x)
    assert float(jax_slope[0]) == 0.0 and np.all(np.isnan(jax_slope[1:4]))  # JAX: 0 at 1, NaN on (1, 2]
    value, slope = jax.vmap(jax.value_and_grad(special.spence))(x)
    np.testing.assert_allclose(value, jax_value, rtol=1e-12)
    assert float(slope[0]) == -1.0 and float(slope[1]) == pytest.approx(-0.9999995, rel=1e-12)
    np.testing.assert_allclose(slope[1:], jnp.log(x[1:]) / (1 - x[1:]), rtol=1e-12)  # log(x) / (1 - x)
    np.testing.assert_allclose(slope[4:], jax_slope[4:], rtol=1e-12)  # and JAX's, where JAX is right
    # smooth through 1: the second derivative there is 1/2
    assert float(jax.hessian(special.spence)(1.0)) == pytest.approx(0.5, rel=1e-12)


def test_spence_slope_at_tiny_x_and_across_its_branches():
    # log(x) / (1 - x) where x - 1 rounds to -1 (log1p(-1) = -inf: the old slope at 1e-20)
    x = jnp.array([1e-300, 1e-20, 1e-15, 0.4999, 0.5, 0.5001])
    slope = jax.jit(jax.vmap(jax.grad(special.spence)))(x)
    np.testing.assert_allclose(slope, np.log(np.asarray(x)) / (1 - np.asarray(x)), rtol=1e-14)
    # the second derivative 1/(x (1 - x)) + log(x)/(1 - x)^2, continuous through the switch at 1/2
    curvature = jax.vmap(jax.hessian(special.spence))(x[3:])
    xs = np.asarray(x[3:])
    np.testing.assert_allclose(curvature, 1 / (xs * (1 - xs)) + np.log(xs) / (1 - xs) ** 2, rtol=1e-12)


def test_expi_slope_is_finite_where_e_to_the_x_overflows():
    # e^x / x: float32 e^89 overflows where the slope (5.04e36) and Ei (5.1e36) do not;
    # float64 likewise from 709.8 to ~716 (SciPy's Ei is inf there already)
    for x, dtype, rtol in ((89.0, np.float32, 1e-6), (92.0, np.float32, 1e-6), (712.0, np.float64, 1e-14)):
        want = float(decimal.Decimal(x).exp() / decimal.Decimal(x))
        got = float(jax.jit(jax.grad(special.expi))(dtype(x)))
        assert got == pytest.approx(want, rel=rtol, abs=0), (x, dtype)
    np.testing.assert_allclose(float(jax.hessian(special.expi)(np.float32(89.0))),
                               np.exp(89.0) / 89.0 * (1 - 1 / 89.0), rtol=1e-5)


def _falling(p, n):
    return math.prod(p - i for i in range(n))


def test_scaled_bessel_derivatives_at_large_x_are_accurate(maybe_jit):
    """kve(3/2, x) = sqrt(pi/2) (x^-1/2 + x^-3/2) and ive(1/2, x) = (2 pi x)^-1/2 (1 - e^-2x)
    exactly: their derivatives in closed form. The recurrences (ive_{v-1} + ive_{v+1}) / 2 -
    ive_v cancel ~x^n-fold: float32 slopes were 1.6e-3 off at 1e4, float64 second derivatives
    3e-4 at 1e6; the host's float64 asymptotic series is not."""
    for n in (1, 2, 3):
        kve_n = maybe_jit(_nth_derivative_in_x(special.kve, n))
        ive_n = maybe_jit(_nth_derivative_in_x(special.ive, n))
        for x in (0.5, 3.0, 24.0, 30.0, 1e4, 1e6):
            want = math.sqrt(math.pi / 2) * (_falling(-0.5, n) * x ** (-0.5 - n) + _falling(-1.5, n) * x ** (-1.5 - n))
            for dtype, rtol in ((np.float64, 1e-11), (np.float32, 2e-6)):
                assert float(kve_n(dtype(1.5), dtype(x))) == pytest.approx(want, rel=rtol, abs=0), (n, x, dtype)
                if x >= 24:  # e^-2x below 1e-20
                    want_i = (2 * math.pi) ** -0.5 * _falling(-0.5, n) * x ** (-0.5 - n)
                    assert float(ive_n(dtype(0.5), dtype(x))) == pytest.approx(want_i, rel=rtol, abs=0), (n, x, dtype)


def _nth_derivative_in_x(f, n):
    return f if n == 0 else jax.grad(_nth_derivative_in_x(f, n - 1), argnums=1)


def test_erfcx_second_and_third_derivatives_at_large_x(maybe_jit):
    """erfcx(x) ~ (1/x - 1/(2x^3) + 3/(4x^5) - 15/(8x^7)) / sqrt(pi), differentiated: the frule's
    2 erfcx + 2x erfcx' cancelled (1e-4 off at 1e6 in float64, 3e-3 at 300 in float32)."""
    second = [(2, -3), (-6, -5), (22.5, -7), (-105, -9)]
    third = [(-6, -4), (30, -6), (-157.5, -8), (945, -10)]
    for n, terms in ((2, second), (3, third)):
        d = maybe_jit(_nth_derivative_in_x(lambda _, x: special.erfcx(x), n))
        for x, dtype, rtol in ((1e3, np.float64, 1e-12), (1e6, np.float64, 1e-14), (300.0, np.float32, 1e-6)):
            want = sum(c * x**p for c, p in terms) / np.sqrt(np.pi)
            assert float(d(0.0, dtype(x))) == pytest.approx(want, rel=rtol, abs=0), (n, x)
        # each side of the switch at 10 (recurrence below, series above) equals the recurrence
        # in float64, which has lost only ~x^(2n) ulps there
        for x in (9.99, 10.01):
            e, s = ss.erfcx(x), 2 * x * ss.erfcx(x) - 2 / np.sqrt(np.pi)
            want = {2: 2 * e + 2 * x * s, 3: 2 * x * (2 * e + 2 * x * s) + 4 * s}[n]
            assert float(d(0.0, x)) == pytest.approx(want, rel=1e-9, abs=0), (n, x)


def test_erfcx_slope_is_accurate_for_large_x():
    """Where jax < 0.11's own rule (2x erfcx(x) - 2/sqrt(pi)) cancels to rounding noise in
    float32 at 1e3 and entirely at 1e8; jax 0.11+ is accurate there too."""

    def exact(x):  # asymptotic series of 2x erfcx(x) - 2/sqrt(pi); exact to double precision here
        t = 1 / (2 * x * x)
        return -(2 / np.sqrt(np.pi)) * t * (1 - 3 * t + 15 * t * t)

    for x in (1e3, 1e4):
        assert abs(float(jax.grad(special.erfcx)(jnp.float32(x))) - exact(x)) < 1e-6 * abs(exact(x))
        assert abs(float(jax.jit(jax.grad(special.erfcx))(jnp.float32(x))) - exact(x)) < 1e-6 * abs(exact(x))
    assert float(jax.grad(special.erfcx)(1e8)) == pytest.approx(exact(1e8), rel=1e-14, abs=0)
    x = jnp.array([-3.0, -0.4, 0.5, 2.0, 8.0, 9.99, 10.0, 30.0])
    theirs = jax.jit(jax.vmap(jax.value_and_grad(jsp.erfcx)))(x)
    np.testing.assert_allclose(jax.vmap(jax.value_and_grad(special.erfcx))(x), theirs, rtol=1e-11)


def test_expi_and_zeta_agree_with_jax_values_and_derivatives():
    x = jnp.array([-4.0, -0.5, 0.3, 2.0, 40.0])
    jax_expi = jax.jit(jax.vmap(jax.value_and_grad(jsp.expi)))(x)
    np.testing.assert_allclose(jax.vmap(jax.value_and_grad(special.expi))(x), jax_expi, rtol=1e-13)
    s, q = jnp.array([1.5, 2.0, 3.0, 7.5]), jnp.array([0.3, 1.0, 2.5, 10.0])
    jax_zeta = jax.jit(jax.vmap(jax.value_and_grad(jsp.zeta, argnums=1)))(s, q)
    np.testing.assert_allclose(jax.vmap(jax.value_and_grad(special.zeta, argnums=1))(s, q), jax_zeta, rtol=1e-12)
    hessian = jax.vmap(jax.hessian(special.zeta, argnums=1))(s, q)
    np.testing.assert_allclose(hessian, s * (s + 1) * ss.zeta(s + 2, q), rtol=1e-12)


# ----- forward and reverse mode, of every order -------------------------------------------------
@pytest.mark.parametrize("name", list(UNARY))
def test_second_derivatives_in_every_mode(name):
    f, x, h = UNARY[name], 1.7, 1e-4
    g = jax.jit(jax.vmap(jax.grad(f)))(x + h * jnp.array([-2.0, -1.0, 1.0, 2.0]))
    expected = float(g[0] - 8 * g[1] + 8 * g[2] - g[3]) / (12 * h)  # five-point difference of the gradient
    modes = {  # under one jit: one compile per mode instead of one per eager op
        "grad(grad)": jax.grad(jax.grad(f)),
        "hessian": jax.hessian(f),
        "jacfwd(jacfwd)": jax.jacfwd(jax.jacfwd(f)),
        "jvp(grad)": lambda x: jax.jvp(jax.grad(f), (x,), (1.0,))[1],
    }
    got = jax.jit(lambda x: {mode: d2(x) for mode, d2 in modes.items()})(x)
    for mode, d2x in got.items():
        assert float(d2x) == pytest.approx(expected, rel=1e-7), mode


def test_third_derivative_of_kv_by_the_recurrence():
    d3 = jax.grad(jax.grad(jax.grad(lambda x: special.kv(0.7, x))))(1.9)
    k = lambda v: ss.kv(v, 1.9)  # noqa: E731
    expected = -(k(-2.3) + 3 * k(-0.3) + 3 * k(1.7) + k(3.7)) / 8
    assert float(d3) == pytest.approx(expected, rel=1e-12)


def test_jvp_and_grad_agree_under_jit(maybe_jit):
    v, x = jnp.array([0.5, 1.5, 2.5]), jnp.array([0.8, 1.6, 3.2])
    _, y_dot = maybe_jit(lambda x: jax.jvp(lambda x: special.kv(v, x), (x,), (jnp.ones(3),)))(x)
    grad = maybe_jit(jax.grad(lambda x: jnp.sum(special.kv(v, x))))(x)
    np.testing.assert_allclose(y_dot, grad, rtol=1e-13)
    np.testing.assert_allclose(grad, -(ss.kv(v - 1, x) + ss.kv(v + 1, x)) / 2, rtol=1e-13)


# ----- documented behaviour ---------------------------------------------------------------------
def test_vmap_is_one_host_call_per_batch(monkeypatch):
    # vmap_method="expand_dims": the unbatched order comes with a size-1 batch axis, the
    # batched x with its batch axis, both in front of the same (broadcast) dimensions.
    shapes, scipy_kv = [], ss.kv

    def counting_kv(v, x):
        shapes.append((np.shape(v), np.shape(x)))
        return scipy_kv(v, x)

    monkeypatch.setattr(ss, "kv", counting_kv)
    v = np.array([[0.5], [1.5]])  # rank 2: broadcasts against x of rank 1
    xs = np.array([[0.7, 1.9, 3.1], [1.0, 2.0, 3.0], [0.2, 0.4, 0.6], [4.0, 5.0, 6.0]])
    batched = jax.jit(jax.vmap(special.kv, in_axes=(None, 0)))(v, xs)
    assert shapes == [((1, 2, 3), (4, 2, 3))]
    np.testing.assert_allclose(batched, np.stack([ss.kv(v, x) for x in xs]), rtol=1e-14)
    both = jax.vmap(special.kv)(np.stack([v, v + 1]), xs[:2])
    np.testing.assert_allclose(both[1], ss.kv(v + 1, xs[1]), rtol=1e-14)


def test_dtypes_follow_the_arguments():
    x32 = jnp.array([0.5, 1.5], jnp.float32)
    assert special.kv(1.5, x32).dtype == jnp.float32  # a Python order does not promote
    assert jax.jit(special.kv)(1, x32).dtype == jnp.float32
    assert jax.grad(lambda x: jnp.sum(special.jv(0.5, x)))(x32).dtype == jnp.float32
    assert jax.jvp(special.erfcx, (x32,), (jnp.ones(2, jnp.float32),))[1].dtype == jnp.float32
    assert special.kv(1, 2).dtype == jnp.float64  # ints: the default float
    assert special.kv(np.array([0, 1]), np.array([1, 2])).dtype == jnp.float64


def test_eager_calls_return_jax_arrays_equal_to_scipy():
    v, x = np.array([[0.5], [2.5]]), np.array([0.4, 1.2, 5.0])
    for name in ORDERED:
        y = getattr(special, name)(v, x)
        assert isinstance(y, jax.Array) and y.shape == (2, 3)
        np.testing.assert_allclose(y, getattr(ss, name)(v, x), rtol=1e-15)
    assert float(special.zeta(2.0)) == pytest.approx(np.pi**2 / 6, rel=1e-15)


def test_broadcast_gradient_sums_over_the_order_axis():
    v, x = jnp.array([[0.5], [1.5], [2.5]]), jnp.array([0.8, 1.6])
    grad = jax.grad(lambda x: jnp.sum(special.iv(v, x)))(x)
    np.testing.assert_allclose(grad, np.sum((ss.iv(v - 1, x) + ss.iv(v + 1, x)) / 2, axis=0), rtol=1e-13)


@pytest.mark.parametrize(
    "f, what",
    [(special.kv, "order v"), (special.struve, "order v"), (special.gammaincc, "shape a"), (special.zeta, "exponent s")],
)
def test_differentiating_the_order_raises_not_implemented(f, what):
    with pytest.raises(rules.NotImplementedTangentError, match=what):
        jax.grad(f, argnums=0)(1.5, 2.0)
    with pytest.raises(rules.NotImplementedTangentError, match=what):
        jax.jvp(lambda p: f(p, 2.0), (1.5,), (1.0,))


def test_complex_arguments_are_refused():
    with pytest.raises(TypeError, match="complex arguments are not supported"):
        special.kv(1.5, 2.0 + 1.0j)
    with pytest.raises(TypeError, match="complex arguments are not supported"):
        jax.jit(special.erfcx)(jnp.array([1.0 + 1.0j]))


def test_gammaincc_second_derivative_in_x_at_zero_is_that_of_exp():
    """Q(1, x) = e^-x: its slope's xlogy(0, x) at x = 0 is the library's (JAX's d/dx is 0/0)."""
    assert float(jax.grad(special.gammaincc, 1)(1.0, 0.0)) == -1.0
    np.testing.assert_allclose(float(jax.hessian(special.gammaincc, 1)(1.0, 0.0)), 1.0, rtol=1e-12)


def test_gammaincc_higher_derivatives_in_x_at_zero():
    """Q(2, x) = (1 + x) e^-x: Q^(2) = (x - 1) e^-x is -1 at 0, Q^(3) = (2 - x) e^-x is 2; the
    slope x e^-x in log space had d/dx 0 * inf = NaN there (`gamma_kernel`)."""
    assert float(jax.hessian(special.gammaincc, 1)(2.0, 0.0)) == -1.0
    assert float(jax.jit(jax.grad(jax.grad(jax.grad(special.gammaincc, 1), 1), 1))(2.0, 0.0)) == 2.0
    assert float(jax.hessian(special.gammaincc, 1)(3.0, 0.0)) == 0.0  # Q(3, x)^(1) = -x^2 e^-x / 2


def test_struve_zero_second_derivative_at_zero_and_beside_it():
    """H_0' = 2/pi - H_1, so H_0'' = -H_1' = -((H_0 - H_2) / 2 + (x/2) / (2 sqrt(pi) Gamma(5/2)))
    (DLMF 11.4.24): 0 at x = 0, where the slope through H_{-1} gave NaN (its slope needs
    H_{-2}(0) = inf). Orders beside 0 in one array keep the general slope."""
    x = np.array([0.0, 1e-3, 0.7, 4.0])
    c = lambda v: 1 / (2 * np.sqrt(np.pi) * ss.gamma(v + 1.5))  # noqa: E731  (x/2)^v c(v): DLMF's extra term
    h0 = -((ss.struve(0, x) - ss.struve(2, x)) / 2 + x / 2 * c(1))
    h2_slope = (ss.struve(1, x) - ss.struve(3, x)) / 2 + (x / 2) ** 2 * c(2)
    h1 = ((2 / np.pi - ss.struve(1, x)) - h2_slope) / 2 + c(1) / 2  # H_1'' = (H_0' - H_2') / 2 + c(1) / 2
    second = jax.jit(jax.vmap(jax.grad(jax.grad(special.struve, 1), 1), in_axes=(None, 0)))
    np.testing.assert_allclose(second(0.0, x), h0, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(second(1.0, x), h1, rtol=1e-12)
    both = jax.vmap(jax.grad(lambda x: jnp.sum(jax.grad(lambda x: jnp.sum(special.struve(jnp.array([0.0, 1.0]), x)))(x))))
    np.testing.assert_allclose(both(x), h0 + h1, rtol=1e-12)  # reverse over reverse, orders 0 and 1 together
    np.testing.assert_allclose(jax.vmap(jax.grad(special.struve, 1), in_axes=(None, 0))(0.0, x), 2 / np.pi - ss.struve(1, x),
                               rtol=1e-14)
