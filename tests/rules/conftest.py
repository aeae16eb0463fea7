"""Shared fixtures for the rule-core tests."""

import jax
import pytest


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def maybe_jit(request):
    """`jax.jit` or the identity, so one test body runs with and without jit."""
    return jax.jit if request.param else (lambda f: f)


@pytest.fixture
def count_compiles(monkeypatch):
    """`count_compiles(name)`: a list that grows each time the finite differences' compiled
    evaluation `_Program.<name>` is traced (a jitted method runs its body only then)."""
    import rules.testing._finite_differences as fd_module

    def count(name):
        compiled, original = [], getattr(fd_module._Program, name)

        def counted(self, *args):
            compiled.append(1)
            return original(self, *args)

        monkeypatch.setattr(fd_module._Program, name, counted)
        return compiled

    return count
