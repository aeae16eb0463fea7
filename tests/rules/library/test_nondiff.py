"""rules.library.nondiff: discrete functions say NoTangent for every argument."""

import jax
import jax.numpy as jnp
import pytest

import rules
from rules._check import _check_one
from rules._registry import examples_of, function_name, functions_with_examples

CASES = [
    pytest.param(f, ex, id=function_name(f))
    for f in functions_with_examples(["rules.library.nondiff"])
    for ex in examples_of(f)
]


@pytest.mark.parametrize("f, example", CASES)
def test_rule_passes_the_testers(f, example):
    row = _check_one(f, example)
    assert row.status == "ok", row.message


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
