"""Compiled evaluations for the testers: one `jax.jit` program per check, kept across calls.

Evaluated eagerly, every operation of a rule compiles on its own (per shape, dtype and the
context JAX runs it in): a linear-algebra rule and its pullback cost about a hundred small
compilations, each as slow as one program holding all of them. The testers therefore trace
each check (the rule and its conventions, the lowered primitive under jit and vmap) into one
program, and keep it: a second call on the same function, argument structure and shapes (a
property test, a loop over inputs) runs the compiled program without tracing again.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Hashable

import jax
import numpy as np

from .._registry import registry_version

__all__ = ["Compiled", "compiled", "jit", "signature"]

_ARRAYS = (jax.Array, np.ndarray, np.generic)


def jit(fn: Callable) -> Any:
    """`jax.jit(fn)` compiled for a check: on CPU at XLA's backend optimization level 0.

    A check runs each program a few times on tiny inputs, so compiling is nearly all of its
    cost; level 0 skips LLVM's optimization of the generated code (about 20% of the
    compilation time of the library's checks) and leaves XLA's own passes, and so the
    numbers computed, as they are. Other backends compile as usual.
    """
    if _fast_compile_supported():
        return jax.jit(fn, compiler_options={"xla_backend_optimization_level": 0})
    return jax.jit(fn)


_FAST_COMPILE: list[bool] = []


def _fast_compile_supported() -> bool:
    if not _FAST_COMPILE:
        import inspect

        has_option = "compiler_options" in inspect.signature(jax.jit).parameters  # jax >= 0.4.36
        _FAST_COMPILE.append(has_option and jax.default_backend() == "cpu")
    return _FAST_COMPILE[0]


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, _ARRAYS) and not isinstance(leaf, jax.core.Tracer)


def signature(tree: Any) -> Hashable | None:
    """What a program traced from `tree` depends on: its structure, its fixed (non-array)
    leaves by type and value, and its arrays' shapes and dtypes; None if a fixed leaf is
    unhashable (then nothing is kept)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    parts: list[Any] = []
    for leaf in leaves:
        if _is_array(leaf):
            parts.append(("array", np.shape(leaf), np.dtype(leaf.dtype).str, bool(getattr(leaf, "weak_type", False))))
            continue
        # floats by repr: 0.0 and -0.0 (equal, with equal hashes) are different constants
        key = (type(leaf), repr(leaf) if isinstance(leaf, (float, complex)) else leaf)
        try:
            hash(key)
        except TypeError:
            return None
        parts.append(key)
    return treedef, tuple(parts)


class _Traced:
    """`body` as a function of the array leaves of its arguments, for one signature: the
    fixed leaves are those of the call that traced it (equal for every call with the same
    signature). The result's traced arrays are the program's outputs; its other leaves (Python
    values, constants made while tracing) are kept from the trace."""

    def __init__(self, body: Callable, leaves: list, treedef: Any, where: list[int]):
        self.body, self.leaves, self.treedef, self.where = body, leaves, treedef, where
        self.out_tree: Any = None
        self.is_traced: list[bool] = []
        self.kept: list[Any] = []
        self.jitted = jit(self._trace)

    def _trace(self, *dynamic: Any) -> list:
        full = list(self.leaves)
        for k, d in zip(self.where, dynamic):
            full[k] = d
        out = self.body(*jax.tree_util.tree_unflatten(self.treedef, full))
        out_leaves, self.out_tree = jax.tree_util.tree_flatten(out)
        self.is_traced = [isinstance(leaf, jax.core.Tracer) for leaf in out_leaves]
        self.kept = [None if t else leaf for leaf, t in zip(out_leaves, self.is_traced)]
        return [leaf for leaf, t in zip(out_leaves, self.is_traced) if t]

    def __call__(self, leaves: list) -> Any:
        values = iter(self.jitted(*(leaves[k] for k in self.where)))
        return jax.tree_util.tree_unflatten(
            self.out_tree, [next(values) if t else leaf for leaf, t in zip(self.kept, self.is_traced)]
        )


class Compiled:
    """`body(*args)` run as one `jax.jit` program of the array leaves of `args`; every
    other leaf (Python numbers, strings, modules, functions) is fixed, as in a closure. One
    program per signature of `args` (see `signature`); the result is `body`'s, with its
    arrays concrete. Exceptions raised while tracing propagate."""

    def __init__(self, body: Callable):
        self.body = body
        self._programs: dict[Hashable, _Traced] = {}
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(args)
        where = [k for k, leaf in enumerate(leaves) if _is_array(leaf)]
        sig = signature(args)
        with self._lock:
            program = None if sig is None else self._programs.get(sig)
        if program is None:
            program = _Traced(self.body, leaves, treedef, where)
            result = program(leaves)  # traces: only a program that traced is kept
            if sig is not None:
                with self._lock:
                    self._programs[sig] = program
            return result
        return program(leaves)


_KEPT = 64  # compiled checks kept, least recently used dropped first
_CACHE: collections.OrderedDict = collections.OrderedDict()
_CACHE_LOCK = threading.Lock()


def compiled(key: Hashable | None, body: Callable) -> Compiled:
    """The `Compiled` of `body`, kept under `key` (with the registry's version: a redefined
    rule gets a new program) for later calls; `key=None` (or an unhashable key) keeps nothing.
    `key` must determine everything `body` reads besides its arguments."""
    if key is None:
        return Compiled(body)
    full = (key, registry_version())
    try:
        hash(full)
    except TypeError:
        return Compiled(body)
    with _CACHE_LOCK:
        hit = _CACHE.get(full)
        if hit is not None:
            _CACHE.move_to_end(full)
            return hit
        program = _CACHE[full] = Compiled(body)
        while len(_CACHE) > _KEPT:
            _CACHE.popitem(last=False)
        return program
