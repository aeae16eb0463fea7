"""`adjoint`: Zygote's rule format, converted into an rrule that JAX transformations use."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
import zygote_jax
from zygote_jax import AdjointWarning, GradientError, adjoint, gradient


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)


def _scaled_sin():
    @rules.primitive
    def mysin(x):
        return jnp.sin(x)

    @adjoint(mysin)
    def mysin_adjoint(x):
        return mysin(x), lambda y_bar: (7 * y_bar * jnp.cos(x),)  # deliberately 7x

    return mysin, mysin_adjoint


def test_scaled_adjoint_is_used_everywhere():
    mysin, _ = _scaled_sin()
    x = jnp.array([0.1, 0.2])
    expected = 7 * np.cos(np.asarray(x))
    close(gradient(lambda x: jnp.sum(mysin(x)), x)[0], expected)
    close(jax.grad(lambda x: jnp.sum(mysin(x)))(x), expected)
    close(jax.jit(jax.grad(lambda x: jnp.sum(mysin(x))))(x), expected)
    close(jax.vmap(jax.grad(mysin))(x), expected)
    close(jax.jit(lambda x: gradient(lambda u: jnp.sum(mysin(u)), x)[0])(x), expected)


def test_adjoint_becomes_an_rrule():
    mysin, mysin_adjoint = _scaled_sin()
    y, back = rules.rrule(mysin, 0.0)
    assert float(y) == 0.0
    f_bar, x_bar = back(1.0)
    assert f_bar is rules.NoTangent() and float(x_bar) == 7.0
    assert float(mysin_adjoint(0.0)[0]) == 0.0  # the decorated function is returned unchanged


def test_none_means_zero():
    @rules.primitive
    def mul(a, b):
        return a * b

    @adjoint(mul)
    def mul_adjoint(a, b):
        return mul(a, b), lambda y_bar: (y_bar * b, None)

    assert gradient(mul, 2.0, 3.0) == (3.0, 0.0)
    assert rules.rrule(mul, 2.0, 3.0)[1](1.0)[2] is rules.ZeroTangent()


def test_none_inside_a_pytree_gradient_means_zero():
    @rules.primitive
    def dot(p):
        return p["a"] * p["b"]

    @adjoint(dot)
    def dot_adjoint(p):
        return dot(p), lambda y_bar: ({"a": y_bar * p["b"], "b": None},)

    assert gradient(dot, {"a": 2.0, "b": 3.0}) == ({"a": 3.0, "b": 0.0},)


def test_back_sees_none_for_zero_parts_of_the_output():
    seen = []

    @rules.primitive
    def both(x):
        return x**2, x**3

    @adjoint(both)
    def both_adjoint(x):
        def back(y_bar):
            seen.append(tuple(b is None for b in y_bar))
            a_bar, b_bar = y_bar
            return ((0 if a_bar is None else a_bar * 2 * x) + (0 if b_bar is None else b_bar * 3 * x**2),)

        return both(x), back

    assert gradient(lambda x: both(x)[1], 2.0) == (12.0,)
    assert seen == [(True, False)]


def test_pullback_must_return_a_tuple():
    @rules.primitive
    def bad(x):
        return 2 * x

    @adjoint(bad)
    def bad_adjoint(x):
        return bad(x), lambda y_bar: 2 * y_bar  # not a tuple

    with pytest.raises(GradientError, match="bad") as err:
        gradient(bad, 1.0)
    assert "tuple" in str(err.value) and "(x_bar,)" in str(err.value)


def test_pullback_must_return_one_gradient_per_argument():
    @rules.primitive
    def add(a, b):
        return a + b

    @adjoint(add)
    def add_adjoint(a, b):
        return add(a, b), lambda y_bar: (y_bar,)

    with pytest.raises(GradientError, match="a tuple of 2"):
        gradient(add, 1.0, 2.0)


def test_adjoint_must_return_value_and_back():
    @rules.primitive
    def ident(x):
        return x

    @adjoint(ident)
    def ident_adjoint(x):
        return x

    with pytest.raises(GradientError, match=r"\(y, back\)"):
        gradient(ident, 1.0)


def test_plain_function_warns_and_primitive_wrapping_uses_the_rule():
    def plain(x):
        return x**2

    with pytest.warns(AdjointWarning, match="rules.primitive"):

        @adjoint(plain)
        def plain_adjoint(x):
            return plain(x), lambda y_bar: (7 * 2 * x * y_bar,)

    assert float(rules.rrule(plain, 3.0)[1](1.0)[1]) == 42.0
    assert gradient(plain, 3.0) == (6.0,)  # JAX does not see the rule of a plain function
    wrapped = rules.primitive(plain)
    assert gradient(wrapped, 3.0) == (42.0,)
    assert float(jax.grad(wrapped)(3.0)) == 42.0


def test_adjoint_with_types_and_complex_convention():
    @rules.primitive
    def cmul(z):
        return (2 + 1j) * z

    @adjoint(cmul, types=(jax.Array,))
    def cmul_adjoint(z):
        return cmul(z), lambda y_bar: (y_bar * np.conj(2 + 1j),)  # ChainRules' convention

    z = jnp.asarray(1.0 + 1.0j)
    assert zygote_jax.pullback(cmul, z)[1](1.0) == (2 - 1j,)
    assert rules.rrule(cmul, 1.0 + 1.0j) is None  # restricted to arrays
