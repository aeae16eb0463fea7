"""How the drop-in namespaces are made: JAX's module, with some names replaced by ours."""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Callable, Iterable

from ..._primitive import Primitive

__all__ = ["Ufunc", "like", "fallback", "overlay"]


class Ufunc(Primitive):
    """A primitive around a `jax.numpy.ufunc` (`logaddexp`): called, it is the primitive (our
    rules); its `reduce` / `accumulate` / `outer` / `at` stay JAX's (JAX's derivatives)."""

    def __getattr__(self, name: str) -> Any:
        if name == "fn":  # not set yet: during __init__
            raise AttributeError(name)
        return getattr(self.fn, name)


def like(jax_fn: Callable) -> Callable[[Callable], Callable]:
    """Give `ours` the name, docstring and signature of `jax_fn` (a wrapper written with JAX's
    parameters that calls the library's function under its own parameter names)."""

    def decorate(ours: Callable) -> Callable:
        jax_params = [(p.name, p.kind, p.default) for p in inspect.signature(jax_fn).parameters.values()]
        our_params = [(p.name, p.kind, p.default) for p in inspect.signature(ours).parameters.values()]
        if jax_params != our_params:  # pragma: no cover - a wrapper written out of step with JAX
            raise TypeError(f"`{ours.__qualname__}` must take `{jax_fn.__name__}`'s parameters {jax_params}; it takes {our_params}")
        return functools.wraps(jax_fn)(ours)

    return decorate


def fallback(module_name: str, jax_module: types.ModuleType, ours: Iterable[str]) -> tuple[Callable, Callable]:
    """`__getattr__` and `__dir__` for a drop-in module: its own names `ours`, then JAX's."""
    ours = tuple(ours)

    def __getattr__(name: str) -> Any:
        try:
            return getattr(jax_module, name)
        except AttributeError:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r} (nor has {jax_module.__name__!r})") from None

    def __dir__() -> list[str]:
        return sorted(set(ours) | set(dir(jax_module)))

    return __getattr__, __dir__


def overlay(name: str, jax_module: types.ModuleType, ours: dict[str, Any]) -> types.ModuleType:
    """A module named `name`: JAX's `jax_module` with the functions in `ours` replacing its own
    (`stats.gamma`: our `logpdf` and `pdf`, JAX's `cdf`, `sf`, ...); `SHADOWED` names them."""
    module = types.ModuleType(name, f"`{jax_module.__name__}`, with the library's {', '.join(sorted(ours))}.")
    getattr_, dir_ = fallback(name, jax_module, ours)
    module.__dict__.update(ours, SHADOWED=tuple(ours), __getattr__=getattr_, __dir__=dir_)
    return module
