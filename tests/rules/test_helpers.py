"""Tests for rules/_helpers.py: scalar_rule, non_differentiable, ignore_derivatives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
from rules import NoTangent, ZeroTangent, frule, rrule, unthunk

# These tests call rules directly (`rules.rrule(f, ...)`), as ChainRules users do, on plain
# functions: the warning that JAX would not see such rules is tested in test_hardening.py.
pytestmark = pytest.mark.filterwarnings("ignore::rules.PlainFunctionWarning")

X = jnp.array([0.5, -1.0, 2.0])


def cotangents(back, y_bar):
    """The pullback's argument cotangents, unthunked."""
    return tuple(unthunk(c) for c in back(y_bar)[1:])


# ------------------------------------------------------------------------------------------
# scalar_rule
# ------------------------------------------------------------------------------------------


def make_tanh(scale=1.0):
    def my_tanh(x):
        return jnp.tanh(x)

    return rules.scalar_rule(my_tanh, lambda x, y: scale * (1 - y**2))


def make_hypot(wrap=False):
    def hypot(a, b):
        return jnp.sqrt(a * a + b * b)

    f = rules.primitive(hypot) if wrap else hypot
    return rules.scalar_rule(f, lambda a, b, y: (a / y, b / y))


def test_scalar_rule_returns_f_and_registers_both_rules():
    def my_exp(x):
        return jnp.exp(x)

    assert rules.scalar_rule(my_exp, lambda x, y: y) is my_exp
    assert rules.has_rrule(my_exp, X) and rules.has_frule(my_exp, X)


def test_scalar_rule_one_argument_partial_uses_the_output():
    my_tanh = make_tanh()
    y_bar = jnp.array([1.0, -2.0, 0.5])
    y, back = rrule(my_tanh, X)
    np.testing.assert_allclose(y, jnp.tanh(X))
    f_bar, x_bar = back(y_bar)
    assert f_bar is NoTangent()
    np.testing.assert_allclose(unthunk(x_bar), jax.vjp(jnp.tanh, X)[1](y_bar)[0], rtol=1e-14)
    np.testing.assert_allclose(unthunk(x_bar), y_bar * (1 - jnp.tanh(X) ** 2), rtol=1e-14)
    x_dot = jnp.array([0.3, 1.0, -1.0])
    y2, y_dot = frule((NoTangent(), x_dot), my_tanh, X)
    np.testing.assert_allclose(y2, jnp.tanh(X))
    np.testing.assert_allclose(y_dot, jax.jvp(jnp.tanh, (X,), (x_dot,))[1], rtol=1e-14)


def test_scalar_rule_zero_seed_and_zero_tangent():
    my_tanh = make_tanh()
    _, back = rrule(my_tanh, X)
    assert back(ZeroTangent()) == (NoTangent(), ZeroTangent())
    _, y_dot = frule((NoTangent(), ZeroTangent()), my_tanh, X)
    assert y_dot is ZeroTangent()


def test_scalar_rule_two_arguments():
    hypot = make_hypot()
    a, b = jnp.array([3.0, 1.0, -2.0]), jnp.array([4.0, 2.0, 0.5])
    y_bar = jnp.array([1.0, 0.5, -1.0])
    y, back = rrule(hypot, a, b)
    np.testing.assert_allclose(y, jnp.hypot(a, b))
    ours = cotangents(back, y_bar)
    expected = jax.vjp(hypot, a, b)[1](y_bar)
    np.testing.assert_allclose(ours[0], expected[0], rtol=1e-14)
    np.testing.assert_allclose(ours[1], expected[1], rtol=1e-14)
    a_dot, b_dot = jnp.array([1.0, 0.0, 2.0]), jnp.array([0.5, 1.0, -1.0])
    _, y_dot = frule((NoTangent(), a_dot, b_dot), hypot, a, b)
    np.testing.assert_allclose(y_dot, jax.jvp(hypot, (a, b), (a_dot, b_dot))[1], rtol=1e-14)
    _, y_dot_a = frule((NoTangent(), a_dot, ZeroTangent()), hypot, a, b)
    np.testing.assert_allclose(y_dot_a, a / y * a_dot, rtol=1e-14)


def test_scalar_rule_multiple_outputs():
    def sincos(x):
        return jnp.sin(x), jnp.cos(x)

    rules.scalar_rule(sincos, lambda x, y: ((jnp.cos(x),), (-jnp.sin(x),)))
    s_bar, c_bar = jnp.array([1.0, 2.0, -1.0]), jnp.array([0.5, -0.5, 1.0])
    (s, c), back = rrule(sincos, X)
    np.testing.assert_allclose(s, jnp.sin(X))
    np.testing.assert_allclose(c, jnp.cos(X))
    (x_bar,) = cotangents(back, (s_bar, c_bar))
    np.testing.assert_allclose(x_bar, jax.vjp(sincos, X)[1]((s_bar, c_bar))[0], rtol=1e-14)
    (x_bar_s,) = cotangents(back, (s_bar, ZeroTangent()))
    np.testing.assert_allclose(x_bar_s, s_bar * jnp.cos(X), rtol=1e-14)
    x_dot = jnp.array([1.0, -1.0, 0.5])
    _, (s_dot, c_dot) = frule((NoTangent(), x_dot), sincos, X)
    expected = jax.jvp(sincos, (X,), (x_dot,))[1]
    np.testing.assert_allclose(s_dot, expected[0], rtol=1e-14)
    np.testing.assert_allclose(c_dot, expected[1], rtol=1e-14)


def test_scalar_rule_wrong_number_of_partials_raises():
    def add(a, b):
        return a + b

    rules.scalar_rule(add, lambda a, b, y: 1.0)
    with pytest.raises(rules.RuleDefinitionError, match="wrong number of partials"):
        rrule(add, 1.0, 2.0)


@pytest.mark.parametrize(
    "b",
    [jnp.array([[4.0, 2.0, 0.5]]), jnp.asarray(2.0), 2.0],
    ids=["(1,3)", "0-d array", "python float"],
)
def test_scalar_rule_broadcasting_sums_over_broadcast_dims(b):
    hypot = make_hypot()
    a = jnp.array([[3.0, 1.0, -2.0], [0.5, 1.5, 2.5]])
    y_bar = jnp.array([[1.0, 0.5, -1.0], [2.0, -0.25, 0.75]])
    y, back = rrule(hypot, a, b)
    assert y.shape == (2, 3)
    a_bar, b_bar = cotangents(back, y_bar)
    expected = jax.vjp(hypot, a, b)[1](y_bar)
    assert a_bar.shape == (2, 3) and jnp.shape(b_bar) == jnp.shape(b)
    np.testing.assert_allclose(a_bar, expected[0], rtol=1e-14)
    np.testing.assert_allclose(b_bar, expected[1], rtol=1e-14)
    a_dot, b_dot = jnp.ones((2, 3)), jnp.ones(jnp.shape(b))
    _, y_dot = frule((NoTangent(), a_dot, b_dot), hypot, a, b)
    np.testing.assert_allclose(y_dot, jax.jvp(hypot, (a, b), (a_dot, b_dot))[1], rtol=1e-14)


def test_scalar_rule_broadcasting_through_a_primitive_under_grad(maybe_jit):
    hypot = make_hypot(wrap=True)
    a, b = jnp.array([[3.0, 1.0, -2.0], [0.5, 1.5, 2.5]]), jnp.array([[4.0, 2.0, 0.5]])
    ga, gb = maybe_jit(jax.grad(lambda a, b: jnp.sum(hypot(a, b)), argnums=(0, 1)))(a, b)
    ea, eb = jax.grad(lambda a, b: jnp.sum(jnp.hypot(a, b)), argnums=(0, 1))(a, b)
    assert ga.shape == (2, 3) and gb.shape == (1, 3)
    np.testing.assert_allclose(ga, ea, rtol=1e-14)
    np.testing.assert_allclose(gb, eb, rtol=1e-14)


def test_scalar_rule_complex_holomorphic_conventions():
    def csquare(z):
        return z * z

    rules.scalar_rule(csquare, lambda z, y: 2 * z)
    z = jnp.array([1.0 + 2.0j, -0.5 + 0.25j])
    seed = jnp.array([0.3 - 1.1j, 2.0 + 0.5j])
    _, back = rrule(csquare, z)
    (z_bar,) = cotangents(back, seed)
    np.testing.assert_allclose(z_bar, seed * jnp.conj(2 * z), rtol=1e-14)
    # ChainRules' cotangent is the conjugate of JAX's vjp with the conjugate seed
    np.testing.assert_allclose(z_bar, jnp.conj(jax.vjp(csquare, z)[1](jnp.conj(seed))[0]), rtol=1e-14)
    _, z_dot = frule((NoTangent(), seed), csquare, z)
    np.testing.assert_allclose(z_dot, jax.jvp(csquare, (z,), (seed,))[1], rtol=1e-14)


def test_scalar_rule_complex_through_a_primitive_matches_native_vjp(maybe_jit):
    def csquare(z):
        return z * z

    prim = rules.scalar_rule(rules.primitive(csquare), lambda z, y: 2 * z)
    z = jnp.array([1.0 + 2.0j, -0.5 + 0.25j])
    seed = jnp.array([0.3 - 1.1j, 2.0 + 0.5j])
    ours = maybe_jit(lambda z, s: jax.vjp(prim, z)[1](s)[0])(z, seed)
    np.testing.assert_allclose(ours, jax.vjp(csquare, z)[1](seed)[0], rtol=1e-14)
    g = maybe_jit(jax.grad(lambda z: jnp.abs(prim(z))))(1.0 + 2.0j)
    np.testing.assert_allclose(g, jax.grad(lambda z: jnp.abs(z * z))(1.0 + 2.0j), rtol=1e-14)


def test_scalar_rule_python_int_argument_gets_no_tangent():
    def scaled_power(x, n):
        return x**n

    rules.scalar_rule(scaled_power, lambda x, n, y: (n * x ** (n - 1), 0.0))
    y, back = rrule(scaled_power, 2.0, 3)
    assert float(y) == 8.0
    f_bar, x_bar, n_bar = back(1.0)
    assert f_bar is NoTangent() and n_bar is NoTangent()
    assert float(unthunk(x_bar)) == pytest.approx(12.0)
    _, y_dot = frule((NoTangent(), 1.0, NoTangent()), scaled_power, 2.0, 3)
    assert float(y_dot) == pytest.approx(12.0)


def test_scalar_rule_keeps_float32():
    my_tanh = make_tanh()
    x = jnp.array([0.5, -1.0], jnp.float32)
    _, back = rrule(my_tanh, x)
    (x_bar,) = cotangents(back, jnp.ones(2, jnp.float32))
    assert x_bar.dtype == jnp.float32


def test_scalar_rule_through_a_primitive_is_used_by_grad(maybe_jit):
    def my_tanh(x):
        return jnp.tanh(x)

    prim = rules.scalar_rule(rules.primitive(my_tanh), lambda x, y: 7 * (1 - y**2))
    g = maybe_jit(jax.grad(lambda x: jnp.sum(prim(x))))(X)
    np.testing.assert_allclose(g, 7 * (1 - jnp.tanh(X) ** 2), rtol=1e-14)
    batched = jax.vmap(jax.grad(prim))(X)
    np.testing.assert_allclose(batched, 7 * (1 - jnp.tanh(X) ** 2), rtol=1e-14)


def test_scalar_rule_two_arguments_through_a_primitive_is_used_by_grad(maybe_jit):
    def mul(a, b):
        return a * b

    prim = rules.scalar_rule(rules.primitive(mul), lambda a, b, y: (7 * b, 7 * a))
    assert float(maybe_jit(jax.grad(prim, argnums=1))(2.0, 3.0)) == pytest.approx(14.0)
    assert maybe_jit(jax.grad(prim, argnums=(0, 1)))(2.0, 3.0) == (21.0, 14.0)


def test_scalar_rule_binds_keyword_arguments_to_their_place(maybe_jit):
    # a keyword reaches the partials positionally; a parameter skipped before it gets its default
    def quadratic(x, a=2.0, b=3.0):
        return a * x * x + b

    prim = rules.scalar_rule(rules.primitive(quadratic), lambda x, a, b, y: (2 * a * x, x * x, 1.0))
    for d in (jax.grad, jax.jacfwd):
        assert float(maybe_jit(d(lambda x: prim(x, b=5.0)))(3.0)) == 12.0
        assert float(maybe_jit(d(lambda x: prim(x, 4.0, b=5.0)))(3.0)) == 24.0
    y, back = rrule(prim, 3.0, b=5.0)  # keyword arguments are constants: a cotangent for x only
    assert float(y) == 23.0 and len(back(1.0)) == 2 and float(unthunk(back(1.0)[1])) == 12.0
    y, y_dot = frule((NoTangent(), 1.0), prim, 3.0, b=5.0)
    assert (float(y), float(y_dot)) == (23.0, 12.0)


def test_scalar_rule_computes_a_thunk_partial_only_for_an_argument_that_moves(maybe_jit):
    # as a partial with no derivative of its own must be: jax.hessian in x alone never sees it
    def scale(a, x):
        return a * x

    computed = []

    def by_a(x):
        computed.append(x)
        return x

    prim = rules.scalar_rule(rules.primitive(scale), lambda a, x, y: (rules.thunk(lambda: by_a(x)), a))
    for d in (jax.grad, jax.jacfwd, jax.hessian):
        maybe_jit(d(prim, argnums=1))(2.0, 3.0)
    _, back = rrule(prim, 2.0, 3.0)
    assert float(unthunk(back(1.0)[2])) == 2.0 and not computed
    assert float(maybe_jit(jax.grad(prim))(2.0, 3.0)) == 3.0 and computed
    assert float(unthunk(back(1.0)[1])) == 3.0


# ------------------------------------------------------------------------------------------
# non_differentiable
# ------------------------------------------------------------------------------------------


def test_non_differentiable_rules_return_no_tangent_everywhere():
    def my_argmax(x, axis):
        return jnp.argmax(x, axis=axis)

    assert rules.non_differentiable(my_argmax) is my_argmax
    x = jnp.array([[1.0, 3.0, 2.0], [4.0, 0.0, 1.0]])
    y, back = rrule(my_argmax, x, 1)
    np.testing.assert_array_equal(y, [1, 0])
    assert back(jnp.ones(2)) == (NoTangent(), NoTangent(), NoTangent())
    y, y_dot = frule((NoTangent(), jnp.ones((2, 3)), NoTangent()), my_argmax, x, 1)
    np.testing.assert_array_equal(y, [1, 0])
    assert y_dot is NoTangent()


def test_non_differentiable_primitive_gives_zero_gradients(maybe_jit):
    def squared(x):
        return x**2

    prim = rules.non_differentiable(rules.primitive(squared))
    g = maybe_jit(jax.grad(lambda x: jnp.sum(prim(x) + x)))(X)
    np.testing.assert_array_equal(g, np.ones(3))  # only the `+ x` term


def test_non_differentiable_with_types_applies_to_those_types_only():
    def half(x):
        return x / 2

    rules.non_differentiable(half, types=(int,))
    assert rules.has_rrule(half, 3) and not rules.has_rrule(half, 3.0)


# ------------------------------------------------------------------------------------------
# ignore_derivatives
# ------------------------------------------------------------------------------------------


def test_ignore_derivatives_passes_the_value():
    np.testing.assert_array_equal(rules.ignore_derivatives(X), X)
    assert rules.ignore_derivatives(2.5) == 2.5
    assert rules.ignore_derivatives(lambda: 4.0) == 4.0
    tree = rules.ignore_derivatives({"a": X, "n": 3})
    assert tree["n"] == 3
    np.testing.assert_array_equal(tree["a"], X)


def test_ignore_derivatives_of_an_array_drops_the_derivative(maybe_jit):
    g = maybe_jit(jax.grad(lambda x: jnp.sum(x * rules.ignore_derivatives(x))))(X)
    np.testing.assert_allclose(g, X)


def test_ignore_derivatives_of_a_pytree_drops_every_leaf(maybe_jit):
    def loss(p):
        frozen = rules.ignore_derivatives(p)
        return jnp.sum(p["w"] * frozen["w"] + p["b"] * frozen["b"] ** 2)

    p = {"w": X, "b": jnp.array([1.0, 2.0, 3.0])}
    g = maybe_jit(jax.grad(loss))(p)
    np.testing.assert_allclose(g["w"], p["w"])
    np.testing.assert_allclose(g["b"], p["b"] ** 2)


def test_ignore_derivatives_of_a_thunk_calls_it_and_drops_the_derivative(maybe_jit):
    g = maybe_jit(jax.grad(lambda x: rules.ignore_derivatives(lambda: x**2) + 3 * x))(2.0)
    assert float(g) == 3.0


def test_ignore_derivatives_is_itself_non_differentiable():
    _, back = rrule(rules.ignore_derivatives, X)
    assert back(jnp.ones(3)) == (NoTangent(), NoTangent())


def test_a_scalar_rule_primitive_has_forward_and_reverse_mode():
    # scalar_rule's frule is the same rule as its rrule: the lowering uses custom_jvp, so
    # jax.jvp works (no ForwardModeError) and jax.grad transposes the frule.
    f = rules.primitive(lambda x: jnp.tanh(x))
    rules.scalar_rule(f, lambda x, y: 7 * (1 - y**2))  # deliberately 7x: proves it is used
    _, y_dot = jax.jvp(f, (0.5,), (1.0,))
    expected = 7 * (1 - np.tanh(0.5) ** 2)
    assert float(y_dot) == pytest.approx(expected)
    assert float(jax.grad(f)(0.5)) == pytest.approx(expected)
    assert float(jax.jit(jax.grad(f))(0.5)) == pytest.approx(expected)
