"""rules.library.logexp: the xlogy family and exprel at their edges, against JAX and the truth."""

from decimal import Decimal, getcontext

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import pytest

import rules
from rules.library import logexp
from rules.library.logexp import exprel, xexpy, xlog1py, xlogx, xlogy
from rules.testing import test_frule, test_rrule, test_scalar


def test_the_module_ships_its_rules(shipped):
    assert {"jax.scipy.special.xlogy", "jax.scipy.special.xlog1py", "xlogx", "xexpy", "exprel"} <= shipped("logexp")


# ----- xlogy, xlog1py: d/dy is 0 where x == 0 ----------------------------------------------------
def test_xlogy_dy_is_zero_at_the_origin_where_jax_gives_nan(maybe_jit):
    # true: xlogy(0, y) = 0 for every y >= 0, so d/dy at (0, 0) is 0
    plain = float(maybe_jit(jax.grad(jsp.xlogy, argnums=1))(0.0, 0.0))
    ours = float(maybe_jit(jax.grad(xlogy, argnums=1))(0.0, 0.0))
    assert np.isnan(plain)
    assert ours == 0.0
    # forward mode too, and the value stays JAX's
    _, plain_dot = jax.jvp(jsp.xlogy, (jnp.float64(0), jnp.float64(0)), (jnp.float64(0), jnp.float64(1)))
    y, y_dot = maybe_jit(lambda x, y: jax.jvp(xlogy, (x, y), (jnp.zeros_like(x), jnp.ones_like(y))))(0.0, 0.0)
    assert np.isnan(float(plain_dot)) and float(y_dot) == 0.0 and float(y) == float(jsp.xlogy(0.0, 0.0)) == 0.0


def test_xlogy_dx_at_y_zero_is_the_one_sided_minus_infinity():
    # true: xlogy(x, 0) = -inf for x > 0, so the slope in x from x = 0 is log(0) = -inf
    assert float(jax.grad(jsp.xlogy, argnums=0)(0.0, 0.0)) == -np.inf  # JAX agrees here
    assert float(jax.grad(xlogy, argnums=0)(0.0, 0.0)) == -np.inf
    assert float(jax.grad(xlogy, argnums=0)(1.5, 0.0)) == -np.inf


def test_xlog1py_dy_is_zero_at_minus_one_where_jax_gives_nan():
    # true: xlog1py(0, y) = 0 for every y >= -1, so d/dy at (0, -1) is 0
    plain = float(jax.grad(jsp.xlog1py, argnums=1)(0.0, -1.0))
    ours = float(jax.grad(xlog1py, argnums=1)(0.0, -1.0))
    assert np.isnan(plain) and ours == 0.0
    assert float(jax.grad(xlog1py, argnums=0)(0.0, -1.0)) == -np.inf  # log1p(-1), one-sided


def test_xlogy_family_agrees_with_jax_at_ordinary_points():
    x, y = jnp.array([0.3, 1.5, -2.0]), jnp.array([0.4, 2.5, 1.1])
    for ours, plain in ((xlogy, jsp.xlogy), (xlog1py, jsp.xlog1py)):
        np.testing.assert_array_equal(ours(x, y), plain(x, y))
        for k in (0, 1):
            grad = lambda f, k=k: jax.grad(lambda x, y: jnp.sum(f(x, y)), argnums=k)(x, y)  # noqa: E731
            np.testing.assert_allclose(grad(ours), grad(plain), rtol=1e-14)


def test_xlogy_family_passes_the_testers():
    x, y = np.array([[0.5], [1.5]]), np.array([[0.3, 2.0, 0.9]])  # broadcast in both arguments
    for f in (xlogy, xlog1py, xexpy):
        test_rrule(f, x, y)
        test_frule(f, x, y)
    test_scalar(xlogx, 0.7)
    test_rrule(xlogy, np.array([0.5, 2.0], np.float32), np.array([0.3, 1.5], np.float32))


def test_rrule_keyed_on_jax_functions_answers_like_chainrules():
    _, back = rules.rrule(jsp.xlogy, jnp.array([0.0, 2.0]), jnp.array([0.0, 4.0]))
    f_bar, x_bar, y_bar = back(jnp.ones(2))
    assert f_bar is rules.NoTangent()
    np.testing.assert_array_equal(rules.unthunk(x_bar), [-np.inf, np.log(4.0)])
    np.testing.assert_array_equal(rules.unthunk(y_bar), [0.0, 0.5])


def test_strong_zero_cotangent_and_tangent():
    # a zero cotangent / tangent meets the partial -inf and stays 0 (0 * -inf would be NaN)
    _, back = rules.rrule(jsp.xlogy, 1.0, 0.0)
    assert float(rules.unthunk(back(0.0)[1])) == 0.0
    _, y_dot = rules.frule((rules.NoTangent(), 0.0, 0.0), jsp.xlogy, 1.0, 0.0)
    assert float(y_dot) == 0.0


# ----- xlogx and the idiom for x^2 log x -----------------------------------------------------------
def test_x_times_xlogx_has_gradient_zero_at_zero_where_the_where_trick_gives_nan(maybe_jit):
    # true: f(x) = x^2 log x, f(0) = 0; f'(x) = 2 x log x + x -> 0 as x -> 0+, so f'(0) = 0
    where_trick = lambda x: jnp.where(x == 0, 0.0, x**2 * jnp.log(x))  # noqa: E731
    plain_xlogy = lambda x: jsp.xlogy(x**2, x)  # noqa: E731
    assert np.isnan(float(maybe_jit(jax.grad(where_trick))(0.0)))
    assert np.isnan(float(maybe_jit(jax.grad(plain_xlogy))(0.0)))
    assert float(maybe_jit(jax.grad(lambda x: x * xlogx(x)))(0.0)) == 0.0
    # and it is the same function elsewhere: f'(2) = 4 log 2 + 2
    assert float(jax.grad(lambda x: x * xlogx(x))(2.0)) == pytest.approx(4 * np.log(2.0) + 2, rel=1e-14)


def test_forward_mode_of_the_idiom_is_nan_as_documented_and_xlogy_of_x_squared_is_right():
    # the docstring of xlogx: forward mode of x * xlogx(x) multiplies xlogx's tangent -inf by
    # x = 0 in JAX's product rule; xlogy(x * x, x) receives the tangent 0 of x * x instead
    assert np.isnan(float(jax.jvp(lambda x: x * xlogx(x), (0.0,), (1.0,))[1]))
    assert float(jax.jvp(lambda x: xlogy(x * x, x), (0.0,), (1.0,))[1]) == 0.0  # true: 0


def test_xlogx_value_and_slope():
    # true: xlogx(0) = 0; slope 1 + log x: -inf at 0 (one-sided), 1 at x = 1
    assert float(xlogx(0.0)) == 0.0 and float(jax.grad(xlogx)(0.0)) == -np.inf
    assert float(jax.grad(xlogx)(1.0)) == 1.0
    assert xlogx(np.float32(2.0)).dtype == np.float32 and xlogx(2).dtype == jnp.result_type(float)


def test_xexpy_is_zero_where_x_is_zero_even_if_exp_overflows():
    # true: 0 * e^y = 0 for finite y; plain 0 * exp(1000) = 0 * inf = NaN
    assert np.isnan(float(jnp.float64(0.0) * jnp.exp(1000.0)))
    assert float(xexpy(0.0, 1000.0)) == 0.0
    # d/dy = x e^y = 0 at x = 0; d/dx = e^y
    assert float(jax.grad(xexpy, argnums=1)(0.0, 1000.0)) == 0.0
    assert float(jax.grad(xexpy, argnums=0)(0.0, 1.0)) == pytest.approx(np.e, rel=1e-15)


def test_xexpy_hessian_is_symmetric_and_right_at_x_zero():
    # d/dy's guard at x = 0 cut its derivative in x: d2/dx dy was 0 one way, e^y the other
    plain = lambda p: p[0] * jnp.exp(p[1])  # noqa: E731
    for p in (jnp.array([0.0, 0.5]), jnp.array([0.7, -1.2])):
        for second in (jax.hessian, lambda f: jax.jacrev(jax.grad(f))):
            np.testing.assert_allclose(second(lambda p: xexpy(p[0], p[1]))(p), second(plain)(p), rtol=1e-14)


# ----- exprel ----------------------------------------------------------------------------------------
def _exprel_truth(x):
    """expm1(x) / x and its slope (x e^x - expm1 x) / x^2 in 80-digit decimal arithmetic."""
    getcontext().prec = 80
    d = Decimal(float(x))
    e = d.exp()
    return float((e - 1) / d), float((d * e - (e - 1)) / (d * d))


def test_exprel_gradient_at_zero_where_the_where_trick_gives_nan(maybe_jit):
    # true: exprel(x) = 1 + x/2 + x^2/6 + ..., so exprel(0) = 1, exprel'(0) = 1/2, exprel''(0) = 1/3
    where_trick = lambda x: jnp.where(x == 0, 1.0, jnp.expm1(x) / x)  # noqa: E731
    assert np.isnan(float(maybe_jit(jax.grad(where_trick))(0.0)))
    assert float(exprel(0.0)) == 1.0
    assert float(maybe_jit(jax.grad(exprel))(0.0)) == 0.5
    assert float(maybe_jit(jax.grad(jax.grad(exprel)))(0.0)) == pytest.approx(1 / 3, rel=1e-15)


@pytest.mark.parametrize("dtype, ulps", [(np.float64, 3), (np.float32, 3)])
def test_exprel_is_accurate_near_zero_and_in_the_tails(dtype, ulps):
    # where the closed form of the slope cancels (small |x|) and in both tails
    x = np.array([-300.0, -20.0, -1.0, -0.999, -1e-3, -1e-9, 1e-9, 1e-3, 0.999, 1.0, 20.0, 80.0], dtype)
    truth = np.array([_exprel_truth(t) for t in x])
    eps = np.finfo(dtype).eps
    value, slope = exprel(x), jax.vmap(jax.grad(exprel))(jnp.asarray(x))
    np.testing.assert_allclose(value, truth[:, 0], rtol=ulps * eps, atol=0)
    np.testing.assert_allclose(slope, truth[:, 1], rtol=ulps * eps, atol=0)
    # plain JAX's slope formula loses ~eps/|x| near 0: 1e6 ulps at 1e-9 in float64 / 1e-3 in float32
    near = jnp.asarray(x[6])
    plain = (near * jnp.exp(near) - jnp.expm1(near)) / near**2
    assert abs(float(plain) - truth[6, 1]) > 1000 * eps * truth[6, 1]


def test_exprel_where_expm1_overflows():
    # true: exprel(710) = e^710 / 710 (the -1/710 is below e^-710 relative) = 3.1544e305 is finite,
    # while expm1(710) = inf in float64
    assert np.isinf(float(jnp.expm1(710.0)))
    value, slope = _exprel_truth(710.0)
    assert float(exprel(710.0)) == pytest.approx(value, rel=4e-16)
    assert float(jax.grad(exprel)(710.0)) == pytest.approx(slope, rel=4e-16)


def test_exprel_second_derivative_where_expm1_overflows_in_every_mode():
    """exprel''(x) = (e^x (x^2 - 2x + 2) - 2) / x^3, finite below x = 716; reverse over reverse
    was NaN from 710 on: the unused expm1 branch's slope, inf, times its zero cotangent."""
    x = np.array([700.0, 710.0, 711.0, 715.0])
    truth = np.exp(x + np.log(x * x - 2 * x + 2) - 3 * np.log(x))  # the -2 / x^3 is below e^-x relative
    grad = jax.grad(exprel)
    for second in (jax.grad(grad), lambda x: jax.jvp(grad, (x,), (1.0,))[1]):
        np.testing.assert_allclose(jax.jit(jax.vmap(second))(x), truth, rtol=1e-13)


def test_exprel_passes_the_testers_and_refuses_complex():
    test_scalar(exprel, 0.4)
    test_frule(exprel, np.array([-2.0, 0.5, 3.0]))
    test_frule(exprel, np.array([-0.5, 0.2, 1.5], np.float32))  # an frule only: JAX transposes it
    with pytest.raises(TypeError, match="exprel.*complex"):
        exprel(jnp.array(1.0 + 1.0j))


def test_module_all_is_what_it_defines():
    assert set(logexp.__all__) == {"xlogy", "xlog1py", "xlogx", "xexpy", "exprel", "weighted_logsumexp", "logsumexp"}


# ----- logsumexp with weights -----------------------------------------------------------------
def test_logsumexp_derivative_in_a_zero_weight_is_the_growth_of_the_sum():
    # y = log(sum(b exp(a))): dy/db_i = exp(a_i - y); a = log([1, 2, 4]), b = [1, 1, 0]: y = log 3
    a, b = jnp.log(jnp.array([1.0, 2.0, 4.0])), jnp.array([1.0, 1.0, 0.0])
    plain = jax.grad(lambda b: jsp.logsumexp(a, b=b))(b)
    ours = jax.grad(lambda b: logexp.logsumexp(a, b=b))(b)
    true = np.array([1.0, 2.0, 4.0]) / 3
    assert float(plain[2]) == 0.0  # JAX drops the zero weight's term
    np.testing.assert_allclose(ours, true, rtol=1e-14)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda a: logexp.logsumexp(a, b=b)))(a), [1 / 3, 2 / 3, 0.0], rtol=1e-14)


def test_logsumexp_keeps_jax_values_and_conventions():
    a = jnp.array([[0.5, -1.0, 2.0], [1.0, 0.2, -0.3]])
    b = jnp.array([[1.0, 0.0, 2.0], [0.5, 1.0, 0.3]])
    for options in ({}, {"axis": 1}, {"axis": 0, "keepdims": True}, {"axis": (0, 1)}):
        np.testing.assert_allclose(logexp.logsumexp(a, b=b, **options), jsp.logsumexp(a, b=b, **options), rtol=1e-14)
        np.testing.assert_allclose(logexp.logsumexp(a, **options), jsp.logsumexp(a, **options), rtol=1e-14)
    value, sign = logexp.logsumexp(a, b=-b, return_sign=True)  # JAX's own function there
    assert float(sign) == -1.0 and float(value) == pytest.approx(float(jsp.logsumexp(a, b=b)))
    # an empty row (every a = -inf): value -inf, derivative 0 (the library's nn.logsumexp's);
    # all weights 0 with finite a: value -inf, derivative in b inf (the sum grows from 0)
    grads = jax.grad(lambda a, b: logexp.logsumexp(a, b=b), argnums=(0, 1))
    a_bar, b_bar = grads(jnp.full(2, -jnp.inf), jnp.ones(2))
    assert a_bar.tolist() == [0.0, 0.0] and b_bar.tolist() == [0.0, 0.0]
    assert np.isposinf(grads(jnp.zeros(2), jnp.zeros(2))[1]).all()


def test_weighted_logsumexp_passes_the_testers():
    a = np.array([[0.5, -1.0, 2.0], [1.0, 0.2, -0.3]])
    test_rrule(logexp.weighted_logsumexp, a, np.array([[1.0, 0.0, 2.0], [0.5, 1.0, 0.3]]), 1)
    test_rrule(logexp.weighted_logsumexp, a, np.array([[0.0, 1.0, 2.0]]), None, True)  # b broadcasts
    _, back = rules.rrule(logexp.weighted_logsumexp, a, np.ones(3))
    assert back(rules.ZeroTangent())[1:3] == (rules.ZeroTangent(), rules.ZeroTangent())


# ----- second derivatives: the strong zeros hold only where a partial is not finite ---------------
E = float(np.e)
SECOND_ORDER = [  # (ours, JAX's reference, a loss of them, the point): each where JAX is right
    (xlogy, jsp.xlogy, lambda f, x, y: 0.5 * (f(x, y) - 1.0) ** 2, (1.0, E)),  # a zero residual: y_bar = 0
    (xlog1py, jsp.xlog1py, lambda f, x, y: 0.5 * (f(x, y) - 1.0) ** 2, (1.0, E - 1)),
    (xexpy, lambda x, y: x * jnp.exp(y), lambda f, x, y: 0.5 * (f(x, y) - 1.0) ** 2, (1.0, 0.0)),
    (xlogx, lambda x: x * jnp.log(x), lambda f, x: f(x) ** 2, (1.0,)),
    (xlogy, jsp.xlogy, lambda f, x, y: f(x, y), (0.0, 2.0)),  # d/dx of the partial x / y is 1/y at x = 0
    (xlog1py, jsp.xlog1py, lambda f, x, y: f(x, y), (0.0, 2.0)),
]


@pytest.mark.parametrize("ours, reference, loss, point", SECOND_ORDER,
                         ids=["xlogy-residual", "xlog1py-residual", "xexpy-residual", "xlogx-squared", "xlogy-x0",
                              "xlog1py-x0"])
def test_second_derivatives_where_a_cotangent_or_x_is_zero_are_jaxs(ours, reference, loss, point):
    argnums = tuple(range(len(point)))
    for second in (jax.hessian, lambda g, argnums: jax.jacrev(jax.jacrev(g, argnums), argnums)):
        got = second(lambda *a: loss(ours, *a), argnums)(*point)
        expected = second(lambda *a: loss(reference, *a), argnums)(*point)
        np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-12, atol=1e-15)


# ----- weighted_logsumexp: second derivatives where a weight is 0 ---------------------------------
def _plain_weighted_lse(axis=None, keepdims=False):
    def f(a, b):  # log(sum(b exp(a))) in plain JAX, right in b at b == 0 where the sum is positive
        m = jax.lax.stop_gradient(jnp.max(a, axis=axis, keepdims=True))
        y = jnp.squeeze(m, axis) if not keepdims else m
        return y + jnp.log(jnp.sum(b * jnp.exp(a - m), axis=axis, keepdims=keepdims))

    return f


WLSE_POINTS = [  # (a, b, axis): the registered examples (zero weights), the brief's point, an ordinary one
    (np.array([[0.0, 0.7, -1.0], [2.0, 0.3, 0.1]]), np.array([[1.0, 0.0, 2.0], [0.5, 1.0, 0.0]]), 1),
    (np.array([0.5, -0.2, 1.0]), np.array([0.0, 1.0, 3.0]), None),
    (np.zeros(3), np.array([1.0, 1.0, 0.0]), None),
    (np.array([0.5, -1.0, 2.0]), np.array([1.0, 0.5, 2.0]), None),
]


@pytest.mark.parametrize("a, b, axis", WLSE_POINTS, ids=["example-axis1", "example-f32-point", "zeros", "ordinary"])
@pytest.mark.parametrize("mode", ["fwd-over-rev", "rev-over-rev"])
def test_weighted_logsumexp_second_derivatives_where_a_weight_is_zero(a, b, axis, mode):
    # JAX's derivative of logsumexp in b drops the terms with b == 0; the pullback's partials are
    # built from y, so their derivatives (the Hessian) were 0 there. True: d2y/db_i db_j = -e^(a_i + a_j) / S^2.
    outer = jax.jacfwd if mode == "fwd-over-rev" else jax.jacrev
    ours = lambda a, b: jnp.sum(logexp.weighted_logsumexp(a, b, axis) ** 2)
    plain = lambda a, b: jnp.sum(_plain_weighted_lse(axis)(a, b) ** 2)
    for argnums in ((0, 1), 1, 0):
        got = jax.jit(outer(jax.jacrev(ours, argnums), argnums))(jnp.asarray(a), jnp.asarray(b))
        expected = jax.jit(outer(jax.jacrev(plain, argnums), argnums))(jnp.asarray(a), jnp.asarray(b))
        np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-12, atol=1e-14)


def test_weighted_logsumexp_hessian_in_b_at_a_zero_weight_is_the_truth():
    h = jax.hessian(logexp.weighted_logsumexp, argnums=1)(jnp.zeros(3), jnp.array([1.0, 1.0, 0.0]))
    np.testing.assert_allclose(np.array(h), np.full((3, 3), -0.25), rtol=1e-14)  # -e^(a_i + a_j) / S^2, S = 2
    # keepdims and the values and first derivatives unchanged
    a, b = jnp.array([[0.0, 0.7], [2.0, 0.3]]), jnp.array([[1.0, 0.0], [0.0, 1.0]])
    f = lambda a, b: jnp.sum(logexp.weighted_logsumexp(a, b, 0, True) ** 2)
    g = lambda a, b: jnp.sum(_plain_weighted_lse(0, True)(a, b) ** 2)
    np.testing.assert_allclose(np.array(jax.hessian(f, (0, 1))(a, b)), np.array(jax.hessian(g, (0, 1))(a, b)),
                               rtol=1e-12, atol=1e-14)
