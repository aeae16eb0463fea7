"""Shared fixtures for the library tests."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
from rules import NoTangent
from rules import _dual
from rules._lowering import DUAL, JVP, VJP
from rules.testing import rand_tangent, test_approx, test_frule


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
def jax_010():
    """Whether this JAX is a 0.10 release (the declared floor), whose own derivatives of some
    functions the library's rules correct (the tests record where)."""
    return tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11)


@pytest.fixture
def shipped():
    """`shipped(module)`: the names of the functions whose examples `rules.library.<module>`
    registers (the checks themselves run in test_every_example.py)."""
    from rules._registry import function_name, functions_with_examples

    return lambda module: {function_name(f) for f in functions_with_examples([f"rules.library.{module}"])}


@pytest.fixture
def count_equations():
    """`count_equations(jaxpr, name)`: equations named `name` in a jaxpr and its sub-jaxprs."""
    return _count


def _check_forward_mode(f, *args, static=(), full=False, **options):
    """jax.jit(jax.vmap(jax.jvp)) and jax.linearize equal the frule (the batch: the input
    twice, with tangents x_dot and 2 x_dot) and run it; jax.vjp runs the rrule. With `full`,
    test_frule too (finite differences, the frule/rrule transposition). `static`: trailing
    positional options; `options`: keywords."""
    if full:
        assert "frule/rrule transposition" in test_frule(f, *args, *static, **options).checks
    tangents = tuple(rand_tangent(x, seed=2) for x in args)
    _, y_dot = rules.frule((NoTangent(), *tangents, *(NoTangent() for _ in static)), f, *args, *static, **options)
    single = any(np.dtype(x.dtype) in (np.float32, np.complex64) for x in args)
    tol = dict(rtol=1e-4, atol=1e-5) if single else dict(rtol=1e-10, atol=1e-12)

    def g(*args):
        return f(*args, *static, **options)

    f._lowered.clear()  # the lowerings built from here on, and their routes
    jvp = jax.jit(jax.vmap(lambda args, tangents: jax.jvp(g, args, tangents)[1]))
    both = jvp(tuple(jnp.stack([x, x]) for x in args), tuple(jnp.stack([t, 2 * t]) for t in tangents))
    for k in (0, 1):
        test_approx(jax.tree.map(lambda t: t[k] / (k + 1), both), y_dot, **tol)
    if not _dual.ENABLED:  # jax.custom_jvp for forward mode, chosen when called
        assert {lowered.mode for lowered in f._lowered.values()} == {JVP}
        jax.eval_shape(lambda *args: jax.vjp(g, *args)[0], *args)
        assert {lowered.mode for lowered in f._lowered.values()} == {JVP, VJP}
        return
    # one primitive serves both modes; its pushforward evaluates the frule (not the pullback)
    assert [(lowered.mode, lowered.fr is not None) for lowered in f._lowered.values()] == [(DUAL, True)]
    assert "pushforward of" in str(jax.make_jaxpr(lambda *a: jax.jvp(g, a, tangents))(*args))
    test_approx(jax.jit(lambda *a: jax.linearize(g, *a)[1](*tangents))(*args), y_dot, **tol)


@pytest.fixture
def check_forward_mode():
    """`check_forward_mode(f, *args, static=(), full=False, **options)`: jax.jvp runs f's frule
    (jit and vmap), jax.vjp its rrule."""
    return _check_forward_mode
