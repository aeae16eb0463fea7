"""Every example shipped in `rules.library` passes the testers: one test per (function,
example), the checks `python -m rules check` runs (tests/rules/test_check_cli.py tests the
command itself on small modules)."""

import pytest

import rules

from rules._check import _check_one, cases, module_of
from rules._registry import function_name

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


def _has_rrule(f, example):
    from rules._registry import rrule
    from rules.testing._compare import WithTangent

    return rrule.lookup(f, tuple(x.primal if isinstance(x, WithTangent) else x for x in example)) is not None


RRULE_FIRST_EXAMPLES = [
    pytest.param(f, example, id=f"{module_of(f).rsplit('.', 1)[-1]}.{function_name(f)}")
    for f, example in dict(cases(["rules.library"])[::-1]).items()  # the first example of each
    if module_of(f) != "rules.library.nondiff" and _has_rrule(f, example)
]


@pytest.mark.parametrize("f, example", RRULE_FIRST_EXAMPLES[::-1])
def test_forward_mode_and_linearize_agree_on_every_shipped_rrule(f, example):
    """jax.linearize works on every shipped primitive with an rrule (before the dual-mode
    lowering, a `jax.custom_vjp` could only be transposed), and its linear map equals
    jax.jvp's tangent. (An frule alone is a `jax.custom_jvp`, which JAX linearizes itself.)"""
    import jax
    import numpy as np

    from rules import NoTangent, _dual
    from rules.testing import rand_tangent, test_approx
    from rules.testing._compare import WithTangent

    if not _dual.ENABLED:
        pytest.skip("jax.linearize of an rrule needs the dual-mode lowering, which is off (tests/rules/test_dual_mode.py)")
    import importlib

    from rules.testing._testers import _primitive_for

    # the shipped primitive (cases() gives its registry key), or one around a JAX function with rules
    f = getattr(importlib.import_module(module_of(f)), getattr(f, "__name__", ""), None) or _primitive_for(f)
    if not isinstance(f, rules.Primitive):
        f = _primitive_for(f)
    primals = [x.primal if isinstance(x, WithTangent) else x for x in example]
    def differentiable(x):
        leaves = jax.tree_util.tree_leaves(x)
        return leaves and all(isinstance(v, (jax.Array, np.ndarray, float)) and np.issubdtype(np.result_type(v), np.inexact)
                              for v in leaves)

    marked = [isinstance(x, WithTangent) and isinstance(x.tangent, NoTangent) for x in example]  # not to perturb
    moved = [i for i, x in enumerate(primals) if differentiable(x) and not marked[i]]

    def g(*xs):
        args = list(primals)
        for i, x in zip(moved, xs):
            args[i] = x
        return f(*args)

    xs = tuple(primals[i] for i in moved)
    tangents = tuple(rand_tangent(x, seed=3) for x in xs)

    @jax.jit  # one compilation, not one per operation
    def both_ways(xs, tangents):
        return jax.jvp(g, xs, tangents)[1], jax.linearize(g, *xs)[1](*tangents)

    y_dot, linearized = both_ways(xs, tangents)
    test_approx(linearized, y_dot, rtol=1e-6, atol=1e-8)
