"""Every example shipped in `rules.library` passes the testers: one test per (function,
example), the checks `python -m rules check` runs (tests/rules/test_check_cli.py tests the
command itself on small modules)."""

import jax
import numpy as np
import pytest

from rules import NoTangent, Primitive, _dual
from rules._check import _check_one, cases, module_of
from rules._registry import function_name, rrule
from rules.testing import rand_tangent, test_approx
from rules.testing._compare import WithTangent

CASES = [
    pytest.param(f, example, id=f"{module_of(f).rsplit('.', 1)[-1]}.{function_name(f)}-{k}")
    for f in dict.fromkeys(f for f, _ in cases(["rules.library"]))
    for k, example in enumerate(ex for g, ex in cases(["rules.library"]) if g is f)
]


def test_every_library_module_has_examples():
    from rules._check import library_modules

    assert {module_of(f).rsplit(".", 1)[-1] for f, _ in (c.values for c in CASES)} == set(library_modules())
    assert len(CASES) > 180


@pytest.mark.parametrize("f, example", CASES)
def test_example_passes_the_testers(f, example):
    row = _check_one(f, example)
    assert row.status == "ok", row.message
    if module_of(f) != "rules.library.nondiff":  # nothing differentiable to lower there
        assert row.lowered == "jit+vmap"


def _primals(example):
    return [x.primal if isinstance(x, WithTangent) else x for x in example]


def _first_examples_with_an_rrule():
    first = {}
    for f, example in cases(["rules.library"]):
        first.setdefault(f, example)
    return [
        pytest.param(f, example, id=f"{module_of(f).rsplit('.', 1)[-1]}.{function_name(f)}")
        for f, example in first.items()
        if module_of(f) != "rules.library.nondiff" and rrule.lookup(f, tuple(_primals(example))) is not None
    ]


def _differentiable(x):
    leaves = jax.tree_util.tree_leaves(x)
    return bool(leaves) and all(
        isinstance(v, (jax.Array, np.ndarray, float)) and np.issubdtype(np.result_type(v), np.inexact) for v in leaves
    )


@pytest.mark.skipif(not _dual.ENABLED, reason="jax.linearize of an rrule needs the dual-mode lowering, which is off")
@pytest.mark.parametrize("f, example", _first_examples_with_an_rrule())
def test_forward_mode_and_linearize_agree_on_every_shipped_rrule(f, example):
    """jax.linearize works on every shipped primitive with an rrule (before the dual-mode
    lowering, a `jax.custom_vjp` could only be transposed), and its linear map equals
    jax.jvp's tangent. (An frule alone is a `jax.custom_jvp`, which JAX linearizes itself.)"""
    # cases() gives the rules' key; the primitive around it uses them
    prim = f if isinstance(f, Primitive) else Primitive(f)
    primals = _primals(example)
    marked = [isinstance(x, WithTangent) and isinstance(x.tangent, NoTangent) for x in example]  # not to perturb
    moved = [i for i, x in enumerate(primals) if _differentiable(x) and not marked[i]]

    def g(*xs):
        args = list(primals)
        for i, x in zip(moved, xs):
            args[i] = x
        return prim(*args)

    xs = tuple(primals[i] for i in moved)
    tangents = tuple(rand_tangent(x, seed=3) for x in xs)

    @jax.jit  # one compilation, not one per operation
    def both_ways(xs, tangents):
        return jax.jvp(g, xs, tangents)[1], jax.linearize(g, *xs)[1](*tangents)

    y_dot, linearized = both_ways(xs, tangents)
    test_approx(linearized, y_dot, rtol=1e-6, atol=1e-8)
