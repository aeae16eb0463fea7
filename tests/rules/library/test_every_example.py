"""Every example shipped in `rules.library` passes the testers: one test per (function,
example), the checks `python -m rules check` runs (tests/rules/test_check_cli.py tests the
command itself on small modules)."""

import pytest

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
