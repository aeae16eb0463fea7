"""Shared fixtures for the rule-core tests."""

import jax
import pytest


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def maybe_jit(request):
    """`jax.jit` or the identity, so one test body runs with and without jit."""
    return jax.jit if request.param else (lambda f: f)
