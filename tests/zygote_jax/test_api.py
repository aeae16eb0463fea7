"""pullback, gradient, withgradient, jacobian, withjacobian: the issue's examples, with and without jit."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
import zygote_jax
from zygote_jax import GradientError, gradient, jacobian, pullback, withgradient, withjacobian


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def maybe_jit(request):
    return jax.jit if request.param else (lambda fn: fn)


# ----- pullback -----------------------------------------------------------------------------
def test_pullback_sin():
    y, back = pullback(jnp.sin, 0.5)
    assert y == 0.479425538604203
    assert back(1.0) == (0.8775825618903728,)


def test_pullback_three_arguments():
    y, back = pullback(lambda a, b, c: a * b * c, 2.0, 3.0, 5.0)
    assert y == 30.0
    assert back(1.0) == (15.0, 10.0, 6.0)


def test_pullback_none_in_seed_means_zero():
    y, back = pullback(lambda a, b: (a * b, a + b, {"s": a - b}), 2.0, 3.0)
    assert back((1.0, None, None)) == (3.0, 2.0)
    assert back((None, 1.0, {"s": None})) == (1.0, 1.0)
    assert back((None, None, {"s": 1.0})) == (1.0, -1.0)
    assert back(None) == (0.0, 0.0)


def test_pullback_integer_outputs_need_no_seed():
    _, back = pullback(lambda a, b: (a * b, jnp.argmax(jnp.array([a, b]))), 2.0, 3.0)
    assert back((1.0, None)) == (3.0, 2.0)


def test_pullback_seed_of_wrong_shape_is_an_error():
    _, back = pullback(lambda x: 2 * x, jnp.ones(3))
    with pytest.raises(GradientError, match=r"shape \(3,\)"):
        back(jnp.ones(2))
    _, back = pullback(lambda x: (x, x), 1.0)
    with pytest.raises(GradientError, match="structure"):
        back({"a": 1.0})


def test_pullback_array_output(maybe_jit):
    def vjp(x, y_bar):
        return pullback(lambda x: x**2, x)[1](y_bar)[0]

    close(maybe_jit(vjp)(jnp.array([1.0, 2.0]), jnp.array([1.0, 10.0])), [2.0, 40.0])


def test_pullback_complex_convention():
    # f(z) = z^2 is holomorphic: ChainRules' pullback is y_bar * conj(f'(z)).
    z = 1.0 + 2.0j
    _, back = pullback(lambda z: z**2, z)
    close(back(1.0)[0], np.conj(2 * z))
    close(back(1j)[0], 1j * np.conj(2 * z))


# ----- gradient ---------------------------------------------------------------------------------
def test_gradient_of_polynomial_at_int():
    assert gradient(lambda x: 3 * x**2 + 2 * x + 1, 5) == (32.0,)
    assert gradient(lambda a, b: a * b, 2, 3) == (3.0, 2.0)


def test_gradient_int_used_as_index_gets_none():
    g = gradient(lambda x, i: x[i], jnp.array([1.0, 2.0, 3.0]), 1)
    close(g[0], [0, 1, 0])
    assert g[1] is None


@pytest.mark.parametrize(
    "f",
    [
        lambda x, n: jnp.sum(jnp.ones(n) * x),  # a shape
        lambda x, n: sum(x for _ in range(n)),  # a range
        lambda x, n: jnp.sum(jnp.arange(3.0)[:n]) * x,  # a slice
        lambda x, n: jnp.take(jnp.full(4, 3.0), n) * x,  # an index of jnp.take (a ValueError for a float)
    ],
    ids=["shape", "range", "slice", "take"],
)
def test_gradient_int_needed_concretely_gets_none(f):
    g = gradient(f, 2.0, 3)
    assert g[1] is None
    assert float(g[0]) == 3.0


def test_gradient_int_in_a_condition():
    # Eagerly, the promoted int is concrete, so Python can branch on it: its gradient is 0.
    # Under jax.jit the branch needs a concrete value, so the int is retried as static: None.
    def f(x, n):
        return x * 3.0 if n > 2 else x

    assert gradient(f, 2.0, 3) == (3.0, 0.0)
    g = jax.jit(lambda x: gradient(f, x, 3))(2.0)
    assert g[0] == 3.0 and g[1] is None


@pytest.mark.parametrize("x, n", [(0.0, 0), (0.0, 1), (-2.0, 3), (1.5, -2)], ids=["0^0", "0^1", "neg", "neg-power"])
def test_gradient_int_exponent_stays_integer_pow(maybe_jit, x, n):
    # f sees the int as it is: x**n is JAX's integer_pow. Promoted, n made it pow, whose
    # derivative at x = 0, n = 0 is n * 0**(n - 1) = 0 * inf = NaN.
    g = maybe_jit(lambda x: gradient(lambda x, n: x**n, x, n))(x)
    assert g[0] == jax.grad(lambda x: x**n)(x)


def test_gradient_int_exponent_is_differentiated_as_a_real():
    gx, gn = gradient(lambda x, n: x**n, 2.0, 3)
    assert gx == 12.0
    close(gn, 8 * np.log(2.0))
    assert gradient(lambda x, n: x**n, 0.0, 0)[1] == 0.0


def test_value_is_fs_own_with_int_arguments(maybe_jit):
    # f runs on the ints as they are: an int output stays an int, exact beyond 2**53.
    val, grad = maybe_jit(lambda x: withgradient(lambda x, n: (x * n, n + 1), x, 2**53))(1.0)
    assert int(val[1]) == 2**53 + 1 and jnp.issubdtype(val[1].dtype, jnp.integer)
    assert grad == (2.0**53, 1.0)
    y, back = pullback(lambda n: n * 2, 3)
    assert y == 6 and jnp.issubdtype(jnp.result_type(y), jnp.integer)
    assert back(1) == (2.0,)
    val, (J,) = withjacobian(lambda n: jnp.arange(3) * n, 2)
    assert jnp.issubdtype(val.dtype, jnp.integer)
    close(val, [0, 2, 4])
    close(J, [0.0, 1.0, 2.0])


def test_gradient_int_as_a_repeat_count_gets_none(maybe_jit):
    # The promoted 3.0 == 3 reaches JAX's caches keyed by the broadcast's static shape. Run
    # first, it left an entry that failed the run with the int, and every later
    # `jnp.repeat(x, 3)` of the user's; it runs after f's own run now, and fails alone.
    x = jnp.arange(7.0)
    g = maybe_jit(lambda x: gradient(lambda x, n: jnp.sum(jnp.repeat(x, n)), x, 3))(x)
    close(g[0], np.full(7, 3.0))
    assert g[1] is None
    assert jnp.repeat(x, 3).shape == (21,)


def test_gradient_int_whose_promotion_changes_the_output_gets_none():
    def f(x, n):
        return x * n if isinstance(n, int) else jnp.full(2, x * n)

    assert gradient(f, 2.0, 3) == (3.0, None)


def test_gradient_complex_convention():
    assert gradient(lambda z: jnp.abs(z) ** 2, 1 + 2j) == (2 + 4j,)
    assert complex(jax.grad(lambda z: jnp.abs(z) ** 2)(1 + 2j)) == 2 - 4j  # JAX's own


def test_gradient_non_differentiable_arguments_get_none():
    g = gradient(lambda x, s, n, b, fn, k: fn(x) * k[0], 1.0, "s", None, True, jnp.sin, jnp.array([2, 3]))
    assert g[1:] == (None, None, None, None, None)
    close(g[0], 2 * np.cos(1.0))


def test_gradient_unused_float_arguments_get_zeros():
    g = gradient(lambda x, y, z: x, 1.0, 2.0, jnp.ones(2))
    assert g[0] == 1.0 and g[1] == 0.0
    close(g[2], [0.0, 0.0])


def test_gradient_pytree_arguments_give_pytree_gradients():
    class P(NamedTuple):
        w: jax.Array
        tag: str

    def loss(p, q):
        return jnp.sum(p.w**2) + q["a"][0] * q["a"][1] + q["n"] * 0.0

    p = P(jnp.array([1.0, 2.0]), "layer")
    q = {"a": (2.0, 3.0), "n": jnp.array(4), "name": "q"}
    gp, gq = gradient(loss, p, q)
    assert isinstance(gp, P) and gp.tag is None
    close(gp.w, [2.0, 4.0])
    assert gq["n"] is None and gq["name"] is None
    assert gq["a"] == (3.0, 2.0)


def test_gradient_dtype_follows_the_argument():
    g = gradient(lambda x: jnp.sum(x**2), jnp.array([1.0, 2.0], jnp.float32))[0]
    assert g.dtype == jnp.float32
    g = gradient(lambda x: x**2, 3)[0]
    assert g.dtype == jnp.float64 and not g.weak_type


def test_gradient_array_output_suggests_jacobian():
    with pytest.raises(GradientError, match="jacobian") as err:
        gradient(lambda x: 2 * x, jnp.ones(3))
    assert "<lambda>" in str(err.value) and "float64[3]" in str(err.value)


def test_gradient_complex_output_suggests_real_or_abs2():
    with pytest.raises(GradientError, match="real.*abs2"):
        gradient(lambda z: z**2, 1.0 + 1j)


def test_gradient_tuple_output_suggests_withgradient():
    def two(x):
        return x, x

    with pytest.raises(GradientError, match="withgradient") as err:
        gradient(two, 1.0)
    assert "two" in str(err.value)
    assert isinstance(err.value, rules.RuleError)


def test_gradient_under_jit_and_vmap(maybe_jit):
    def f(x):
        return jnp.sum(jnp.sin(x) * x)

    x = jnp.array([0.1, 0.2, 0.3])
    expected = jnp.sin(x) + x * jnp.cos(x)
    close(maybe_jit(lambda x: gradient(f, x)[0])(x), expected)
    close(maybe_jit(jax.vmap(lambda x: gradient(lambda u: jnp.sin(u) * u, x)[0]))(x), expected)


def test_gradient_nested():
    assert gradient(lambda x: gradient(lambda y: y**3, x)[0], 2.0) == (12.0,)


def test_gradient_python_control_flow():
    def f(x, n):
        for i in range(n):
            x = jnp.sin(x) if i % 2 == 0 else x * 2.0
        return x

    close(gradient(f, 0.3, 2)[0], 2 * np.cos(0.3))
    assert gradient(f, 0.3, 2)[1] is None


def test_gradient_uses_the_rule_of_a_primitive(maybe_jit):
    @rules.primitive
    def scaled_square(x):
        return x * x

    @scaled_square.rrule
    def scaled_square_rrule(x):
        def scaled_square_pullback(y_bar):
            return rules.NoTangent(), 7 * 2 * x * y_bar  # deliberately 7x

        return scaled_square(x), scaled_square_pullback

    close(maybe_jit(lambda x: gradient(lambda u: jnp.sum(scaled_square(u)), x)[0])(jnp.array([1.0, 2.0])), [14.0, 28.0])


# ----- withgradient -----------------------------------------------------------------------------
def test_withgradient_tuple_output():
    x = jnp.array([1.0, 2.0, 4.0])
    res = withgradient(lambda x: (jnp.sum(1 / x), 1 / x), x)
    assert isinstance(res, zygote_jax.WithGradient)
    val, grad = res
    close(val[0], 1.75)
    close(val[1], 1 / x)
    close(grad[0], -1 / x**2)


def test_withgradient_scalar_namedtuple_and_dict():
    class Out(NamedTuple):
        loss: jax.Array
        aux: jax.Array

    val, grad = withgradient(lambda x: x**2, 3.0)
    assert val == 9.0 and grad == (6.0,)
    val, grad = withgradient(lambda x: Out(x**2, x**3), 3.0)
    assert isinstance(val, Out) and val.aux == 27.0 and grad == (6.0,)
    val, grad = withgradient(lambda x: {"z_loss": x**2, "a_aux": x**3}, 3.0)
    assert list(val) == ["z_loss", "a_aux"] and grad == (6.0,)


def test_outputs_may_carry_strings_and_objects():
    val, grad = withgradient(lambda x: (x**2, "aux", None, {"cls": object}), 2.0)
    assert val[1:] == ("aux", None, {"cls": object}) and grad == (4.0,)
    y, back = pullback(lambda x: {"y": 2 * x, "note": "hi"}, 1.0)
    assert y["note"] == "hi" and back({"y": 1.0, "note": None}) == (2.0,)


def test_gradient_without_arguments_and_of_constants():
    assert gradient(lambda: 1.0) == ()
    assert gradient(lambda s: 1.0, "s") == (None,)
    assert gradient(lambda x: x > 0, 1.0) == (0.0,)  # a bool output has zero derivative


def test_withgradient_first_item_must_be_scalar():
    with pytest.raises(GradientError, match="withgradient"):
        withgradient(lambda x: (x * jnp.ones(2), x), 1.0)


def test_withgradient_under_jit():
    val, grad = jax.jit(lambda x: withgradient(lambda u: (jnp.sum(u**2), u), x))(jnp.array([1.0, 2.0]))
    close(val[0], 5.0)
    close(grad[0], [2.0, 4.0])


# ----- jacobian ---------------------------------------------------------------------------------
def test_jacobian_zygote_layout(maybe_jit):
    J_a, J_x = maybe_jit(lambda a, x: jacobian(lambda a, x: a**2 * x, a, x))(jnp.array([1.0, 2.0, 3.0]), 1.0)
    close(J_a, np.diag([2.0, 4.0, 6.0]))
    close(J_x, [1.0, 4.0, 9.0])
    assert J_x.shape == (3,)


def test_jacobian_int_argument_and_shapes():
    J_a, J_x = jacobian(lambda a, x: a**2 * x, jnp.array([1.0, 2.0, 3.0]), 1)
    close(J_x, [1.0, 4.0, 9.0])
    (J,) = jacobian(lambda x: x.T, jnp.ones((2, 3)))
    assert J.shape == (6, 6)
    (J,) = jacobian(jnp.sum, jnp.array([1.0, 2.0, 3.0]))
    close(J, [[1.0, 1.0, 1.0]])
    J, none = jacobian(lambda x, name: x * 2, jnp.ones(2), "name")
    assert none is None and J.shape == (2, 2)


def test_jacobian_pytree_argument():
    (J,) = jacobian(lambda p: p["w"] * p["b"], {"w": jnp.array([1.0, 2.0]), "b": 3.0})
    close(J["w"], 3 * np.eye(2))
    close(J["b"], [1.0, 2.0])


def test_withjacobian_returns_the_value():
    val, (J,) = withjacobian(lambda x: x**3, jnp.array([1.0, 2.0]))
    close(val, [1.0, 8.0])
    close(J, np.diag([3.0, 12.0]))


def test_jacobian_of_a_tuple_is_an_error():
    with pytest.raises(GradientError, match="pullback"):
        jacobian(lambda x: (x, x), 1.0)


def test_jacobian_uses_the_rule_under_jit():
    @rules.primitive
    def triple(x):
        return 3 * x

    @triple.rrule
    def triple_rrule(x):
        return triple(x), lambda y_bar: (rules.NoTangent(), 7 * 3 * y_bar)  # deliberately 7x

    (J,) = jax.jit(lambda x: jacobian(triple, x))(jnp.ones(2))
    close(J, 21 * np.eye(2))
