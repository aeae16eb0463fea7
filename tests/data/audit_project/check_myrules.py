"""The project's own tests: they call the custom derivatives, and assert nothing about them."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import myrules


def test_values():
    x = jnp.array([0.3, -1.2, 0.7])
    assert np.all(np.abs(myrules.softclip(x)) < 1)
    assert np.all(myrules.smooth_relu(x) > 0)
    assert myrules.scaled_square(x, 2.0).shape == (3,)
    assert myrules.cube(x).shape == (3,)


def test_under_jit_only():
    assert jax.jit(myrules.only_traced)(jnp.ones(2)).shape == (2,)


def test_static_arguments_and_keywords():
    x = jnp.array([0.3, -1.2, 0.7])
    assert myrules.reduce(x, "sum").shape == myrules.reduce(x, "mean").shape == ()  # two calls to check
    assert myrules.noisy(x, seed=3.0).shape == (3,)  # a keyword named like a tester option
    assert myrules.tolerant(x, rtol=0.5).shape == (3,)
    assert myrules.outer(x).shape == (3,)


def test_a_call_that_raises_is_not_audited():
    with pytest.raises(ValueError, match="vector"):
        myrules.norm2(jnp.ones((2, 2)))
    assert myrules.norm2(jnp.array([3.0, 4.0])) == 25.0


def test_stopping_the_run():
    if os.environ.get("ZJ_AUDIT_EXIT"):
        pytest.exit("stopped by the test")
