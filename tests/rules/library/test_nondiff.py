"""rules.library.nondiff: discrete functions say NoTangent for every argument."""

import jax
import jax.numpy as jnp
import pytest

import rules


@pytest.mark.parametrize("f", [jnp.argmax, jnp.floor, jnp.greater, jnp.shape, jax.random.split])
def test_declared_non_differentiable(f):
    assert rules.has_rrule(f, jnp.ones(3)) or rules.has_rrule(f, jnp.ones(3), jnp.ones(3))


def test_pullback_is_all_no_tangent():
    y, back = rules.rrule(jnp.argmax, jnp.array([1.0, 3.0, 2.0]))
    assert int(y) == 1
    assert back(1.0) == (rules.NoTangent(), rules.NoTangent())


def test_gradient_through_a_rounding_primitive_is_zero():
    pfloor = rules.primitive(jnp.floor)
    assert float(jax.grad(lambda x: pfloor(x) * x)(2.5)) == 2.0  # only the direct x term
