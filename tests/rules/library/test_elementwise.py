"""rules.library.elementwise: every rule verified by the testers, and what it does better."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules


def test_the_module_ships_its_rules(shipped):
    assert len(shipped("elementwise")) >= 45


def test_rrule_keyed_on_the_jax_function_answers_like_chainrules():
    y, back = rules.rrule(jnp.sin, 0.5)
    assert float(y) == pytest.approx(np.sin(0.5))
    f_bar, x_bar = back(1.0)
    assert f_bar is rules.NoTangent()
    assert float(x_bar) == pytest.approx(np.cos(0.5))


def test_rrule_via_ad_composition_uses_the_registered_rule():
    # rrule_via_ad prefers the registered rule: the pullback is the library's, not jax.vjp.
    _, back = rules.rrule_via_ad(jnp.tanh, jnp.array([0.2, -0.4]))
    expected = 1 - jnp.tanh(jnp.array([0.2, -0.4])) ** 2
    np.testing.assert_allclose(rules.unthunk(back(1.0)[1]), expected, rtol=1e-12)


def test_abs_has_a_zero_subgradient_at_zero_where_jax_has_one():
    pabs = rules.primitive(jnp.abs)
    assert float(jax.grad(jnp.abs)(0.0)) == 1.0  # JAX picks one side
    assert float(jax.grad(pabs)(0.0)) == 0.0  # ChainRules: sign(0) == 0
    (z_bar,) = jax.vjp(pabs, 0j)[1](1.0)
    assert complex(z_bar) == 0j and not np.isnan(complex(z_bar))


def test_abs_of_complex_uses_the_real_part_of_the_seed():
    pabs = rules.primitive(jnp.abs)
    z = jnp.array(3.0 + 4.0j)
    np.testing.assert_allclose(jax.grad(lambda z: pabs(z))(z), jax.grad(lambda z: jnp.abs(z))(z), rtol=1e-12)


def test_hypot_and_sinc_are_finite_at_the_origin():
    phypot, psinc = rules.primitive(jnp.hypot), rules.primitive(jnp.sinc)
    grads = jax.grad(phypot, argnums=(0, 1))(0.0, 0.0)
    assert all(np.isfinite(float(g)) for g in grads)
    assert float(jax.grad(psinc)(0.0)) == 0.0


def test_scalar_rules_broadcast_and_reduce():
    a, b = jnp.ones((2, 3)), jnp.array([[1.0, 2.0, 3.0]])
    _, back = rules.rrule(jnp.multiply, a, b)
    _, a_bar, b_bar = back(jnp.ones((2, 3)))
    assert rules.unthunk(a_bar).shape == (2, 3)
    np.testing.assert_allclose(rules.unthunk(b_bar), jnp.full((1, 3), 2.0))


# ----- edges where plain JAX is wrong (issue 23): plain JAX's value, ours, the true one --------
def _grads(f, *args):
    """jax.grad of f in every argument, eagerly and under jit (the same numbers both ways)."""
    argnums = tuple(range(len(args)))
    eager = jax.grad(f, argnums=argnums)(*args)
    jitted = jax.jit(jax.grad(f, argnums=argnums))(*args)
    np.testing.assert_array_equal(np.array(eager), np.array(jitted))
    return np.array(eager)


# (function, arguments, the true gradient (one entry per argument), why it is true)
EDGES = [
    (jnp.expm1, (-40.0,), (np.exp(-40.0),), "d expm1 = exp; expm1(-40) + 1 rounds to 0"),
    (jax.nn.elu, (-40.0,), (np.exp(-40.0),), "alpha exp(x) for x <= 0, alpha = 1"),
    (jax.nn.selu, (-40.0,), (1.0507009873554805 * 1.6732632423543772 * np.exp(-40.0),), "scale alpha exp(x)"),
    (jax.nn.celu, (-40.0,), (np.exp(-40.0),), "exp(x / alpha), alpha = 1"),
    (jax.nn.sigmoid, (np.float32(17.0),), (np.float32(np.exp(-17.0) / (1 + np.exp(-17.0)) ** 2),), "s(x) s(-x)"),
    (jnp.tanh, (np.float32(-9.01),), (np.float32(1 / np.cosh(9.01) ** 2),), "sech(x)**2"),
    (jnp.sinc, (1e-8,), (-(np.pi**2) * 1e-8 / 3,), "series: -pi**2 x / 3 + O(x**3)"),
    (jnp.arcsinh, (1e200,), (1e-200,), "1 / sqrt(x**2 + 1)"),
    (jnp.arccosh, (1e200,), (1e-200,), "1 / sqrt(x**2 - 1)"),
    (jnp.arctan2, (1e-200, 1e-200), (0.5e200, -0.5e200), "(b, -a) / (a**2 + b**2)"),
    (jnp.logaddexp, (-np.inf, -np.inf), (0.0, 0.0), "an empty sum, as the library's logsumexp"),
    (jnp.logaddexp, (np.float32(1e8), np.float32(1e8)), (0.5, 0.5), "equal weights; y rounds to 1e8"),
    (jnp.power, (0.0, 0.0), (0.0, np.nan), "ChainRules: d/dx 0**p at p = 0 is 0; d/dp is NaN"),
    (jnp.hypot, (0.0, 0.0), (0.0, 0.0), "the zero subgradient"),
]


@pytest.mark.parametrize("f, args, true, why", EDGES, ids=[f"{f.__name__}{args}" for f, args, _, _ in EDGES])
def test_edge_gradients_are_the_true_ones_where_plain_jax_is_wrong(f, args, true, why):
    plain = _grads(f, *args)
    ours = _grads(rules.primitive(f), *args)
    dtype = np.result_type(*args)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    # (plain JAX 0.10.2 is NaN, inf or wrong at each; some later JAX releases fixed a few)
    np.testing.assert_allclose(ours, np.array(true, dtype), rtol=rtol, atol=0, err_msg=f"{why}; plain JAX: {plain}")


# ChainRules.jl's table of x**p at x = 0 (test/rulesets/Base/fastmath_able.jl): (x, p) => (dx, dp)
POWERGRADS = [
    ((1.0, 2.0), (2.0, 0.0)),
    ((2.0, 2.0), (4.0, 2.772588722239781)),
    ((0.0, 2.0), (0.0, 0.0)),
    ((-0.0, 2.0), (-0.0, 0.0)),
    ((0.0, 1.0), (1.0, 0.0)),
    ((-0.0, 1.0), (1.0, 0.0)),
    ((0.0, 0.0), (0.0, np.nan)),
    ((-0.0, 0.0), (0.0, np.nan)),
    ((0.0, -1.0), (-np.inf, np.nan)),
    ((-0.0, -1.0), (-np.inf, np.nan)),
    ((0.0, -2.0), (-np.inf, np.nan)),
    ((-0.0, -2.0), (np.inf, np.nan)),
    ((0.0, 0.5), (np.inf, 0.0)),
    ((0.0, 3.5), (0.0, 0.0)),
    ((0.0, -1.5), (-np.inf, np.nan)),
]


@pytest.mark.parametrize("xp, expected", POWERGRADS, ids=[str(xp) for xp, _ in POWERGRADS])
def test_power_at_zero_follows_chainrules_table(xp, expected):
    ppow = rules.primitive(jnp.power)
    grads = jax.grad(ppow, argnums=(0, 1))(*xp)
    _, y_dot_x = jax.jvp(lambda x: ppow(x, xp[1]), (xp[0],), (1.0,))
    _, back = rules.rrule(jnp.power, *xp)
    pulled = [float(rules.unthunk(t)) for t in back(1.0)[1:]]
    for got in ([float(g) for g in grads], [float(y_dot_x), expected[1]], pulled):
        np.testing.assert_array_equal(np.array(got), np.array(expected))  # NaN == NaN, and signed zeros
        assert [np.signbit(g) for g in got] == [np.signbit(e) for e in expected]


def test_complex_sign_and_arccosh_match_finite_differences_at_chainrules_points():
    from rules.testing import test_frule, test_rrule

    for f, z in ((jnp.sign, -1.1 - 0.21j), (jnp.arccosh, -1.1 - 3.1j), (jnp.arcsinh, 0.3 - 1.7j)):
        test_rrule(f, np.array([z, 0.4 + 0.2j]))
        test_frule(f, np.array([z, 0.4 + 0.2j]))
    # sign(z) = z / |z| turns with z: its derivative is not 0 (the rule's, before, for every z);
    # away from 0 plain JAX differentiates z / |z| right, in JAX's convention
    psign = rules.primitive(jnp.sign)
    for z, seed in ((1j, 1.0 + 0j), (2.0 + 0j, 1j), (-1.1 - 0.21j, 0.3 - 2j)):
        ours = jax.vjp(psign, z)[1](seed)[0]
        plain = jax.vjp(lambda z: z / jnp.abs(z), z)[1](seed)[0]
        np.testing.assert_allclose(complex(ours), complex(plain), rtol=1e-12, atol=1e-15)
        assert complex(ours) != 0
    # and its second derivative (the pullback took jnp.sign, whose derivative is 0 on jax < 0.11)
    z, d1, d2 = jnp.array(0.3 + 0.4j), jnp.array(0.7 - 0.2j), jnp.array(-0.1 + 0.5j)
    second = lambda f: jax.jvp(lambda w: jax.jvp(f, (w,), (d1,))[1], (z,), (d2,))[1]  # noqa: E731
    pullback_dot = lambda f: jax.jvp(lambda w: jax.vjp(f, w)[1](1 - 2j)[0], (z,), (d1,))[1]  # noqa: E731
    for order in (second, pullback_dot):
        np.testing.assert_allclose(complex(order(psign)), complex(order(lambda z: z / jnp.abs(z))), rtol=1e-12)


def test_squareplus_is_finite_and_right_where_x_squared_overflows():
    from rules.library.nn import squareplus

    x = np.float32([1e20, -1e10])
    fixed = jax.__version_info__[:3] >= (0, 12, 1)  # JAX takes a hypotenuse there since
    assert np.isfinite(jax.nn.squareplus(x)[0]) == fixed  # plain JAX before 0.12.1 squares x: inf
    np.testing.assert_allclose(squareplus(x), np.float32([1e20, 4 / 4e10]), rtol=1e-6)
    slope = jax.grad(lambda x: squareplus(x).sum())(x)
    np.testing.assert_allclose(slope, np.float32([1.0, 4 / (4 * 1e20)]), rtol=1e-5)  # b / (4 x**2) on the left (JAX: 0)
    assert float(jax.grad(jax.nn.squareplus)(x[0])) == (1.0 if fixed else 0.5)  # before 0.12.1: half the true slope
    np.testing.assert_allclose(squareplus(np.array([-2.0, 0.5, 3.0]), 2.0), jax.nn.squareplus(np.array([-2.0, 0.5, 3.0]), 2.0))


# Where JAX's own derivative is right, so are its second derivatives: a rule's guard for an
# edge (an infinite tie, 0 ** 0) must not hold its partial constant at ordinary points nearby.
SECOND_ORDER = [
    (jnp.logaddexp, (0.3, 0.3)),  # a finite tie: the weights' derivative is 1/4
    (jnp.logaddexp2, (0.3, 0.3)),
    (jnp.logaddexp, (np.float32(2.0), np.float32(2.0))),
    (jnp.power, (2.0, 0.0)),  # d/dp of p x**(p - 1) at p = 0 is 1/x
    (jnp.power, (0.7, 2.5)),  # d2/dx dp and d2/dp2 are JAX's log x where x > 0
    (jnp.power, (np.float32(1.3), np.float32(3.0))),
]


@pytest.mark.parametrize("f, args", SECOND_ORDER, ids=[f"{f.__name__}{args}" for f, args in SECOND_ORDER])
def test_second_derivatives_at_ordinary_points_are_jaxs(f, args):
    argnums = tuple(range(len(args)))
    rtol = 1e-6 if np.result_type(*args) == np.float32 else 1e-12
    for second in (jax.hessian, lambda g, argnums: jax.jacrev(jax.jacrev(g, argnums), argnums)):
        ours, plain = second(rules.primitive(f), argnums)(*args), second(f, argnums)(*args)
        np.testing.assert_allclose(np.array(ours, np.float64), np.array(plain, np.float64), rtol=rtol, atol=1e-12)


# x**p at x = 0, differentiated two and three times in x: the partial p x**(p - 1) must not be
# differentiated by JAX's pow, whose slope of x**0 at 0 is 0 * 0**-1 = NaN (the second
# derivative of x**1, the third of x**2, every one of x**0). p = 0.5 is infinite there.
POWER_AT_ZERO = [  # (p, (d2, d3) of x**p in x at x = 0)
    (0.0, (0.0, 0.0)),
    (1.0, (0.0, 0.0)),
    (2.0, (2.0, 0.0)),
    (3.0, (0.0, 6.0)),
    (0.5, (-np.inf, np.inf)),  # -p (1 - p) x**(p - 2) and its slope
]
NESTINGS = {  # outermost first
    2: [(jax.jacfwd, jax.jacrev), (jax.jacrev, jax.jacrev), (jax.jacfwd, jax.jacfwd)],
    3: [(jax.jacfwd,) * 3, (jax.jacrev,) * 3, (jax.jacfwd, jax.jacrev, jax.jacrev), (jax.jacrev, jax.jacfwd, jax.jacrev)],
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("p, true", POWER_AT_ZERO, ids=[f"p={p}" for p, _ in POWER_AT_ZERO])
def test_power_higher_derivatives_in_x_at_zero_are_the_true_ones(p, true, dtype):
    ppow = rules.primitive(jnp.power)
    for order, value in zip((2, 3), true):
        for i, nesting in enumerate(NESTINGS[order]):
            f = lambda x: ppow(x, dtype(p))
            for transform in reversed(nesting):
                f = transform(f)
            zeros = np.zeros(2, dtype)
            runs = [jax.jit(f)(dtype(0.0)), *jax.jit(jax.vmap(f))(zeros)]
            if i == 0:  # eagerly too (op by op: most of this test's time), once per order
                runs += [f(dtype(0.0)), *jax.vmap(f)(zeros)]
            for got in runs:
                assert got.dtype == dtype
                np.testing.assert_array_equal(got, dtype(value), err_msg=f"order {order}, {[t.__name__ for t in nesting]}")


def test_power_hessian_in_x_and_p_at_zero_has_the_true_second_derivative_in_x():
    # x's own entry at every p; the whole Hessian for p >= 2, where x**(p - 1) (1 + p log x) and
    # x**p log(x)**2 tend to 0 (for p <= 1 the cross entries diverge: conventions, not checked)
    ppow = rules.primitive(jnp.power)
    for p, d2 in ((0.0, 0.0), (1.0, 0.0), (2.0, 2.0), (3.0, 0.0)):
        for hessian in (jax.hessian, lambda f, argnums: jax.jacrev(jax.jacrev(f, argnums), argnums)):
            h = np.array(hessian(ppow, (0, 1))(0.0, p))
            assert h[0, 0] == d2, (p, h)
            if p >= 2:
                np.testing.assert_array_equal(h, [[d2, 0.0], [0.0, 0.0]])


def test_power_hessian_at_negative_x_keeps_chainrules_real_log():
    # d/dp x**p = x**p log|x| (the real part, as the first derivative): the Hessian is finite
    # and symmetric at an integer p (JAX's log(x) is NaN there, also in x's own lane)
    ppow = rules.primitive(jnp.power)
    x, log = -1.5, np.log(1.5)
    for p in (2.0, 3.0):
        cross = x ** (p - 1) * (1 + p * log)
        true = [[p * (p - 1) * x ** (p - 2), cross], [cross, x**p * log**2]]
        for hessian in (jax.hessian, lambda f, argnums: jax.jacrev(jax.jacrev(f, argnums), argnums)):
            np.testing.assert_allclose(np.array(hessian(ppow, (0, 1))(x, p)), true, rtol=1e-12)
