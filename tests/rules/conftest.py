"""Shared fixtures for the rule-core tests."""

import jax
import pytest


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def maybe_jit(request):
    """`jax.jit` or the identity, so one test body runs with and without jit."""
    return jax.jit if request.param else (lambda f: f)


@pytest.fixture
def count_compiles(monkeypatch):
    """`count_compiles(name)`: a list that grows each time a program traced from the finite
    differences' evaluation `_Program.<name>` is compiled by XLA (not each time it is traced:
    every call traces, and a program lowered before reuses its compilation). Starts with no
    compilation kept, so that what other tests compiled does not count."""
    import rules.testing._compiled as compiled_module
    import rules.testing._finite_differences as fd_module

    monkeypatch.setattr(compiled_module, "_EXECUTABLES", compiled_module.Kept(compiled_module._EXECUTABLES.size))
    traced: list = [None]  # the method whose trace the next `compiled` call compiles
    counters: dict = {}
    original_compiled = compiled_module.compiled

    def compiled(stage, leaves):
        before, name = compiled_module.stats["compiled"], traced[0]
        traced[0] = None
        program = original_compiled(stage, leaves)
        if compiled_module.stats["compiled"] > before and name in counters:
            counters[name].append(1)
        return program

    monkeypatch.setattr(compiled_module, "compiled", compiled)

    def count(name):
        counters[name], original = [], getattr(fd_module._Program, name)

        def counted(self, *args):
            traced[0] = name
            return original(self, *args)

        monkeypatch.setattr(fd_module._Program, name, counted)
        return counters[name]

    return count
