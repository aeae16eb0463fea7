"""rules.library.special_jax: jax.scipy.special's own functions, right at their edges."""

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import pytest
import scipy.special as ss

import rules
from rules import NoTangent
from rules.testing import test_frule, test_rrule, with_tangent


def test_the_module_ships_its_rules(shipped):
    names = {"betainc", "betaln", "gammainc", "gammaincc", "i0", "i1", "i0e", "i1e"}
    assert shipped("special_jax") == {f"jax.scipy.special.{name}" for name in names}


# ----- JAX's own special functions: rules keyed on them --------------------------------------------


def test_betainc_slope_at_the_ends_where_jax_gives_nan(maybe_jit):
    # true: I_x(1, 1) = x, I_x(2, 1) = x^2, I_x(1, 2) = 1 - (1 - x)^2: slopes 1, 1, 2 (at x = 1), 2 (at x = 0)
    pbetainc = rules.primitive(jsp.betainc)
    for (a, b, x), truth in (((1.0, 1.0, 0.0), 1.0), ((1.0, 1.0, 1.0), 1.0), ((2.0, 1.0, 1.0), 2.0), ((1.0, 2.0, 0.0), 2.0)):
        assert np.isnan(float(maybe_jit(jax.grad(jsp.betainc, argnums=2))(a, b, x)))
        assert float(maybe_jit(jax.grad(pbetainc, argnums=2))(a, b, x)) == pytest.approx(truth, rel=1e-14)
        assert float(pbetainc(a, b, x)) == float(jsp.betainc(a, b, x))


def _nth_derivative(f, n):
    return f if n == 0 else jax.grad(_nth_derivative(f, n - 1))


def test_betainc_higher_derivatives_at_the_ends_are_the_polynomials(maybe_jit):
    # I_x(2, 1) = x^2, I_x(1, 2) = 2x - x^2, I_x(3, 2) = 4x^3 - 3x^4: the slope's own
    # derivatives at x = 0 and 1 are 0 * inf in log space (0 or NaN before the kernel's rule)
    pbetainc = rules.primitive(jsp.betainc)
    cases = [((2.0, 1.0, 0.0), [2.0, 0.0]), ((1.0, 2.0, 1.0), [-2.0, 0.0]), ((3.0, 2.0, 0.0), [0.0, 24.0]),
             ((3.0, 2.0, 1.0), [-12.0, -48.0])]
    for (a, b, x), truth in cases:
        for n, want in zip((2, 3), truth):
            got = float(maybe_jit(_nth_derivative(lambda x: pbetainc(a, b, x), n))(x))
            assert got == pytest.approx(want, rel=1e-12, abs=1e-12), (a, b, x, n)


def test_betainc_derivative_in_the_shapes_is_not_implemented_as_in_jax():
    with pytest.raises(ValueError, match="not supported"):
        jax.grad(jsp.betainc, argnums=0)(2.0, 3.0, 0.4)
    with pytest.raises(rules.NotImplementedTangentError, match="betainc.*a and b"):
        jax.grad(rules.primitive(jsp.betainc), argnums=0)(2.0, 3.0, 0.4)


def test_betainc_agrees_with_jax_at_an_ordinary_point():
    x = jnp.array([0.2, 0.6])
    ours = jax.vmap(jax.grad(rules.primitive(jsp.betainc), argnums=2), in_axes=(None, None, 0))(2.5, 1.5, x)
    np.testing.assert_allclose(ours, jax.vmap(jax.grad(jsp.betainc, argnums=2), in_axes=(None, None, 0))(2.5, 1.5, x), rtol=1e-12)
    test_frule(jsp.betainc, with_tangent(np.array([2.5, 1.0]), NoTangent()), with_tangent(np.array([1.5, 3.0]), NoTangent()),
               np.array([0.2, 0.7]))


def test_betaln_derivatives_are_digammas_to_third_order_where_jax_010s_are_wrong(maybe_jit, jax_010):
    """d/da log B(a, b) = psi(a) - psi(a + b); JAX 0.10 differentiates its own series, whose
    second derivatives are 100-200% off wherever a = b and whose first lose digits at (8, 9)."""
    a, b = np.array([1.0, 0.5, 10.0, 1e3, 8.0, 2.0]), np.array([1.0, 0.5, 10.0, 1e3, 9.0, 3.0])
    pbetaln = rules.primitive(jsp.betaln)
    slope = np.stack([ss.digamma(a) - ss.digamma(a + b), ss.digamma(b) - ss.digamma(a + b)])
    t_ab = -ss.polygamma(1, a + b)
    hessian = np.stack([np.stack([ss.polygamma(1, a) + t_ab, t_ab]), np.stack([t_ab, ss.polygamma(1, b) + t_ab])])
    t3 = -ss.polygamma(2, a + b)
    third_aaa, third_aab = ss.polygamma(2, a) + t3, t3

    one = lambda a, b: pbetaln(a, b)  # noqa: E731  (scalars, so that hessian is 2 x 2)
    grad = maybe_jit(jax.vmap(jax.grad(one, argnums=(0, 1))))
    hess = maybe_jit(jax.vmap(jax.hessian(one, argnums=(0, 1))))
    np.testing.assert_allclose(np.stack(grad(a, b)), slope, rtol=1e-11)
    np.testing.assert_allclose(np.array(hess(a, b)), hessian, rtol=1e-11)
    np.testing.assert_array_equal(pbetaln(a, b), jsp.betaln(a, b))
    if maybe_jit is not jax.jit:  # the rest compiled only (eagerly, op by op, ~10 s on jax 0.12)
        return
    third = jax.jit(jax.vmap(jax.jacfwd(jax.hessian(one))))  # d^3/da^3, in a alone
    mixed = jax.jit(jax.vmap(jax.grad(lambda a, b: jax.hessian(one)(a, b), argnums=1)))  # d^3/da^2 db
    np.testing.assert_allclose(third(a, b), third_aaa, rtol=1e-11)
    np.testing.assert_allclose(mixed(a, b), third_aab, rtol=1e-11)
    # JAX's own Hessian (its program alone takes seconds to compile: once)
    jax_hessian = np.array(jax.jit(jax.vmap(jax.hessian(jsp.betaln, argnums=(0, 1))))(a, b))
    wrong = ~np.isclose(jax_hessian, hessian, rtol=1e-3).all(axis=(0, 1))
    assert wrong.tolist() == ([True, True, True, True, False, False] if jax_010 else [False] * 6)


def test_betaln_slopes_where_the_shapes_differ_by_orders_of_magnitude(maybe_jit):
    # psi(a) - psi(a + b) as two digammas cancels where b << a: 1.7e-3 off at (1e12, 2) in float64,
    # 1.4e-3 at (1e4, 1) in float32. For an integer b it is -sum_{k<b} 1/(a + k), and its
    # derivative in a (the Hessian's) sum_{k<b} 1/(a + k)^2: references without cancellation
    pbetaln = rules.primitive(jsp.betaln)
    grad = maybe_jit(jax.grad(pbetaln, argnums=(0, 1)))
    d2 = maybe_jit(jax.hessian(pbetaln, argnums=0))
    for a, b, dtype, rtol in ((1e12, 2, np.float64, 1e-14), (1e6, 3, np.float64, 1e-14), (45.0, 1, np.float64, 1e-14),
                              (1e4, 1, np.float32, 1e-6), (300.0, 2, np.float32, 1e-6)):
        by_a, by_b = grad(dtype(a), dtype(b))
        assert float(by_a) == pytest.approx(-sum(1 / (a + k) for k in range(b)), rel=rtol, abs=0), (a, b)
        assert float(by_b) == pytest.approx(ss.digamma(b) - ss.digamma(a + b), rel=rtol, abs=0), (a, b)
        assert float(d2(dtype(a), dtype(b))) == pytest.approx(sum(1 / (a + k) ** 2 for k in range(b)), rel=rtol, abs=0), (a, b)
    # a small b at a = 1: psi(1) - psi(1 + b) = -b pi^2/6 + b^2 zeta(3) - ...
    b = 1e-8
    assert float(grad(1.0, b)[0]) == pytest.approx(-b * np.pi**2 / 6 + b * b * ss.zeta(3), rel=1e-14, abs=0)


def test_gammainc_slopes_at_zero_where_jax_gives_nan(maybe_jit):
    # true: P(1, x) = 1 - e^-x, Q(1, x) = e^-x: slopes +1 and -1 at x = 0
    for f, truth in ((jsp.gammainc, 1.0), (jsp.gammaincc, -1.0)):
        assert np.isnan(float(maybe_jit(jax.grad(f, argnums=1))(1.0, 0.0)))
        assert float(maybe_jit(jax.grad(rules.primitive(f), argnums=1))(1.0, 0.0)) == truth


def test_gammainc_higher_derivatives_at_zero_are_those_of_the_closed_forms(maybe_jit):
    # P(2, x) = 1 - (1 + x) e^-x: P^(2) = (1 - x) e^-x, P^(3) = (x - 2) e^-x; P(3, x)^(1) =
    # x^2 e^-x / 2: P^(2)(0) = 0, P^(3)(0) = 1; P(1.5, x)^(2) is +inf at 0+ (x^0.5). JAX's
    # and the old rule's x^(a-1) in log space gave 0 or NaN there (0 * inf)
    for f, sign in ((jsp.gammainc, 1.0), (jsp.gammaincc, -1.0)):
        pf = rules.primitive(f)
        for a, truth in ((2.0, [1.0, -2.0]), (3.0, [0.0, 1.0]), (1.5, [np.inf])):
            for n, want in zip((2, 3), truth):
                got = float(maybe_jit(_nth_derivative(lambda x: pf(a, x), n))(0.0))
                assert got == pytest.approx(sign * want, rel=1e-13, abs=1e-13), (f, a, n)
        hess = maybe_jit(jax.vmap(jax.hessian(pf, argnums=1), in_axes=(None, 0)))(2.0, jnp.array([0.0, 0.5]))
        np.testing.assert_allclose(hess, sign * np.array([1.0, 0.5 * np.exp(-0.5)]), rtol=1e-13)


def test_gammainc_derivative_in_a_is_jaxs():
    for f in (jsp.gammainc, jsp.gammaincc):
        a, x = jnp.array([0.8, 2.5]), jnp.array([0.3, 1.7])
        grad = lambda g, k: jax.grad(lambda a, x: jnp.sum(g(a, x)), argnums=k)(a, x)  # noqa: E731
        np.testing.assert_allclose(grad(rules.primitive(f), 0), grad(f, 0), rtol=1e-13)
        np.testing.assert_allclose(grad(rules.primitive(f), 1), grad(f, 1), rtol=1e-13)
        test_rrule(f, np.array([0.8, 2.5]), np.array([0.3, 1.7]))


def test_gammainc_second_derivative_in_x_alone_is_jaxs(maybe_jit):
    # JAX's d/da (its igamma_grad_a) has no derivative: the rule computes it only where a moves,
    # so the Hessian in x alone is JAX's, and that of e^-x at a = 1, x = 0 (JAX: NaN)
    a, x, h = np.array([0.8, 2.5, 4.0]), np.array([0.3, 1.7, 2.2]), 1e-5
    for f, sign in ((jsp.gammainc, 1.0), (jsp.gammaincc, -1.0)):
        pf, want = rules.primitive(f), jax.jit(jax.vmap(jax.hessian(f, argnums=1)))(a, x)  # references: jitted
        slope = jax.jit(jax.vmap(jax.grad(pf, argnums=1)))
        np.testing.assert_allclose(want, (slope(a, x + h) - slope(a, x - h)) / (2 * h), rtol=1e-8)
        for d2 in (jax.hessian(pf, argnums=1), jax.grad(jax.grad(pf, argnums=1), argnums=1)):
            np.testing.assert_allclose(maybe_jit(jax.vmap(d2))(a, x), want, rtol=1e-12)
        assert float(maybe_jit(jax.hessian(pf, argnums=1))(1.0, 0.0)) == -sign
        mixed = lambda g: jax.vmap(jax.jacfwd(jax.grad(g, argnums=1), argnums=0))  # noqa: E731  (the x-slope, by a)
        np.testing.assert_allclose(maybe_jit(mixed(pf))(a, x), jax.jit(mixed(f))(a, x), rtol=1e-12)


def test_gammainc_second_derivative_in_a_raises_as_jaxs():
    # JAX has no derivative of its d/da: an error (JAX's own), not a number
    for f in (jsp.gammainc, jsp.gammaincc):
        for g in (f, rules.primitive(f)):
            with pytest.raises(NotImplementedError, match="igamma_grad_a"):
                jax.hessian(g, argnums=0)(2.5, 1.3)
        np.testing.assert_allclose(jax.jacfwd(rules.primitive(f), argnums=0)(2.5, 1.3),
                                   jax.jacfwd(f, argnums=0)(2.5, 1.3), rtol=1e-13)  # first order: JAX's


def test_bessel_i0_slope_at_1e_300_and_where_i0_overflows(jax_010):
    # true: I_0' = I_1; I_1(1e-300) = 1e-300 / 2 (its series x/2 + x^3/16 + ...);
    # I_1(800) = e^800 / sqrt(1600 pi) (1 - ...) ~ 1e345 overflows to inf
    pi0 = rules.primitive(jsp.i0)
    plain_tiny, plain_big = float(jax.grad(jsp.i0)(1e-300)), float(jax.grad(jsp.i0)(800.0))
    if jax_010:  # 0.10.2 differentiates e^|x| i0e(x): 1 + (i1e - i0e) rounds to 0; inf * 0 at 800
        assert plain_tiny == 0.0 and np.isnan(plain_big)
    assert float(jax.grad(pi0)(1e-300)) == pytest.approx(5e-301, rel=1e-15, abs=0)
    assert float(jax.grad(pi0)(800.0)) == np.inf and float(jax.grad(pi0)(-800.0)) == -np.inf
    assert float(jax.grad(pi0)(0.0)) == 0.0


def test_bessel_i1_slope_at_zero_tiny_and_large_x():
    # true: I_1' = I_0 - I_1 / x = 1/2 + 3x^2/16 + ...: 1/2 at 0 and at 1e-300; at 800 it is
    # ~ e^800 / sqrt(1600 pi) ~ 1e345 -> inf, where JAX's inf - inf is NaN
    pi1 = rules.primitive(jsp.i1)
    assert np.isnan(float(jax.grad(jsp.i1)(800.0)))
    assert float(jax.grad(pi1)(800.0)) == np.inf and float(jax.grad(pi1)(-800.0)) == np.inf
    assert float(jax.grad(pi1)(0.0)) == 0.5 and float(jax.grad(pi1)(1e-300)) == 0.5
    for x in (0.7, 50.0, 700.0):  # SciPy: I_0(x) - I_1(x) / x
        assert float(jax.grad(pi1)(x)) == pytest.approx(ss.i0(x) - ss.i1(x) / x, rel=1e-12)


def _i1_series_derivative(x, n):
    """The n-th derivative of I_1's series sum_k (x/2)^(2k+1) / (k! (k+1)!), exact in float64 for |x| < 1."""
    total = 0.0
    for k in range(12):
        p = 2 * k + 1
        if p >= n:
            total += math.prod(range(p - n + 1, p + 1)) * x ** (p - n) / (2**p * math.factorial(k) * math.factorial(k + 1))
    return total


def test_bessel_i1_second_and_third_derivatives_near_zero(maybe_jit):
    # the slope's quotient i0e - i1e / x cancels in its own derivatives at small x: float32 was
    # 480% off at 2e-4 (series below 1e-4 only), float64 2e-8 at 1e-4; the series now reaches
    # 0.5 (float32) and 0.05 (float64), and is not multiplied by e^|x| e^-|x|
    pi1 = rules.primitive(jsp.i1)
    for dtype, xs, rtol in ((np.float32, (1e-6, 2e-4, 1e-3, 0.3, 0.49, 0.51, 0.8), 2e-5),
                            (np.float64, (1e-6, 1e-4, 1e-3, 0.049, 0.051, 0.3, 0.8), 1e-12)):
        for n in (2, 3):
            d = maybe_jit(_nth_derivative(pi1, n))
            for x in xs:
                want = _i1_series_derivative(float(dtype(x)), n)
                assert float(d(dtype(x))) == pytest.approx(want, rel=rtol, abs=0), (dtype, n, x)


def test_scaled_bessel_slopes_at_zero_tiny_and_large_x():
    # true: i0e' = i1e - sign(x) i0e: -1 at 1e-300 (i0e = 1, i1e = 5e-301), 0 at 0 (the zero
    # subgradient between the one-sided -1 and +1, as ChainRules' abs); i1e' = e^-|x| I_1' - sign(x) i1e:
    # 1/2 at 0 and at 1e-300. JAX agrees at these points (its scaled rules are right).
    pi0e, pi1e = rules.primitive(jsp.i0e), rules.primitive(jsp.i1e)
    assert float(jax.grad(pi0e)(0.0)) == float(jax.grad(jsp.i0e)(0.0)) == 0.0
    assert float(jax.grad(pi0e)(1e-300)) == -1.0
    assert float(jax.grad(pi1e)(0.0)) == 0.5 and float(jax.grad(pi1e)(1e-300)) == 0.5
    for x in (0.7, 50.0, 800.0):  # SciPy
        assert float(jax.grad(pi0e)(x)) == pytest.approx(ss.i1e(x) - ss.i0e(x), rel=1e-12, abs=0)
        assert float(jax.grad(pi1e)(x)) == pytest.approx(ss.i0e(x) - ss.i1e(x) / x - ss.i1e(x), rel=1e-12, abs=0)


def test_bessel_rules_pass_the_testers_and_agree_with_jax():
    x = np.array([-1.3, 0.4, 6.0])
    for f in (jsp.i0, jsp.i1, jsp.i0e, jsp.i1e):
        test_rrule(f, x)
        np.testing.assert_allclose(jax.vmap(jax.grad(rules.primitive(f)))(x), jax.vmap(jax.grad(f))(x), rtol=1e-13)
