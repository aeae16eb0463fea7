"""Shared fixtures for the library tests."""

import pytest


def _count(jaxpr, name):
    """How many equations named `name` a jaxpr holds, sub-jaxprs (pjit, custom_vjp) included."""

    def subs(value):
        if hasattr(value, "jaxpr") and hasattr(value, "consts"):  # ClosedJaxpr
            return [value.jaxpr]
        if hasattr(value, "eqns"):
            return [value]
        if isinstance(value, (tuple, list)):
            return [j for v in value for j in subs(v)]
        return []

    return sum(e.primitive.name == name for e in jaxpr.eqns) + sum(
        _count(sub, name) for e in jaxpr.eqns for v in e.params.values() for sub in subs(v)
    )


@pytest.fixture
def count_equations():
    """`count_equations(jaxpr, name)`: equations named `name` in a jaxpr and its sub-jaxprs."""
    return _count
