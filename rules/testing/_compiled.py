"""Compiled evaluations for the testers: the code is traced on every call, and only a
compiled executable is reused, keyed by the whole lowered program (`_key`); a program that
calls back into Python is never reused. Why one program per check, and why this is never
stale: rules/testing/README.md.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import threading
from typing import Any, Callable

import jax
import numpy as np

from .._boundary import rebuilt
from .._lowering import _aux_key

__all__ = ["Program", "jit", "run"]

_ARRAYS = (jax.Array, np.ndarray, np.generic)

_OPTIMIZED_FROM = 4096


def _is_small(leaves: list) -> bool:
    """Fewer than `_OPTIMIZED_FROM` input elements: compiling costs more than running."""
    return sum(int(np.size(leaf)) for leaf in leaves) < _OPTIMIZED_FROM

# XLA:CPU debug options for small programs, compiled quickly (measured: rules/testing/README.md)
_QUICK_OPTIONS: dict[str, Any] = {
    "xla_backend_optimization_level": 0,  # no LLVM optimization of the generated code
    "xla_cpu_use_fusion_emitters": False,  # fused element-wise loops by the elemental emitter
    "xla_cpu_parallel_codegen_split_count": 1,  # one LLVM module, not one per thread
}


@functools.cache
def _quick_options() -> dict[str, Any]:
    """`_QUICK_OPTIONS` that this JAX and XLA accept, on CPU; `{}` elsewhere (found once)."""
    return _accepted(_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {}


def _accepted(options: dict[str, Any]) -> dict[str, Any]:
    """The entries of `options` with which XLA compiles a small program: XLA renames and
    retires its debug options between releases (an unknown one is an error)."""
    lowered = jax.jit(lambda x: x + 1).lower(np.float32(0))
    try:
        lowered.compile(compiler_options=options)
        return dict(options)
    except Exception:  # noqa: BLE001 - one of them is unknown: find which
        pass
    kept: dict[str, Any] = {}
    for name, value in options.items():
        try:
            lowered.compile(compiler_options={**kept, name: value})
        except Exception:  # noqa: BLE001 - XLA's error for an option it does not have
            continue
        kept[name] = value
    return kept


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, _ARRAYS) and not isinstance(leaf, jax.core.Tracer)


class _Traced:
    """`body` as a function of the array leaves of its arguments, the other leaves fixed.
    The result's traced arrays are the program's outputs; its other leaves (Python values,
    constants made while tracing) are kept from the trace."""

    def __init__(self, body: Callable, leaves: list, treedef: Any, where: list[int]):
        self.body, self.leaves, self.treedef, self.where = body, leaves, treedef, where
        self.out_tree: Any = None
        self.is_traced: list[bool] = []
        self.kept: list[Any] = []

    def __call__(self, *dynamic: Any) -> list:
        out = self.body(*rebuilt(self.treedef, self.leaves, self.where, dynamic))
        out_leaves, self.out_tree = jax.tree_util.tree_flatten(out)
        self.is_traced = [isinstance(leaf, jax.core.Tracer) for leaf in out_leaves]
        self.kept = [None if t else leaf for leaf, t in zip(out_leaves, self.is_traced)]
        return [leaf for leaf, t in zip(out_leaves, self.is_traced) if t]

    def result(self, values: list) -> Any:
        """The body's result, its traced leaves from the program's outputs `values`."""
        it = iter(values)
        leaves = [next(it) if t else leaf for leaf, t in zip(self.kept, self.is_traced)]
        return jax.tree_util.tree_unflatten(self.out_tree, leaves)


class _ByIdentity:
    """An object as a key by its identity, held (its address cannot be reused while kept)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByIdentity) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def _constants(jaxpr: Any) -> list:
    """The constants of a trace and of every jaxpr nested in it (a `jit`'s, a `custom_jvp`'s,
    a loop's), once each: JAX >= 0.11 passes those over `jax_embedded_constants_max_bytes` to
    the executable as arguments, wherever they stand, and the text does not show them."""
    found: dict[int, Any] = {}
    todo = [jaxpr]
    while todo:
        j = todo.pop(0)
        found.update((id(c), c) for c in getattr(j, "consts", ()))
        todo += [v for eqn in getattr(getattr(j, "jaxpr", j), "eqns", ()) for value in eqn.params.values()
                 for v in (value if isinstance(value, (tuple, list)) else (value,))
                 if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")]
    return list(found.values())


def _values_key(consts: list) -> tuple:
    """The constants of a trace (`_constants`), by value: JAX embeds small ones in the lowered
    module (its text shows them) and passes large ones to the executable, so an executable of
    another trace would run with that trace's values; they key it too. A typed PRNG key
    counts by its key data; any other constant NumPy cannot read, by identity (JAX arrays
    are immutable: the same object has the same values)."""
    out: list = []
    for c in consts:
        dtype = getattr(c, "dtype", None)
        try:
            if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
                a = np.asarray(jax.random.key_data(c))
            else:
                a = np.asarray(c)
        except Exception:  # noqa: BLE001 - an extended dtype NumPy has no view of
            out.append(_ByIdentity(c))
            continue
        out.append((str(dtype if dtype is not None else a.dtype), a.shape, hashlib.blake2b(a.tobytes()).digest()))
    return tuple(out)


# Custom calls through which a compiled program calls back into Python (`jax.pure_callback`,
# `io_callback`, `jax.debug.callback`, `rules.external`), as JAX names them on CPU and GPU, and
# the host transfers that carry them on TPU. The lowered text names the mechanism, not which
# Python function it calls: such a program is compiled for its own trace, never reused.
_HOST_CALLBACK_MARKS = ("python_cpu_callback", "python_gpu_callback", "_xla_host_transfer")


def holds_host_callback(text: str) -> bool:
    """Whether a lowered module calls Python while it runs (a test keeps the marks current)."""
    return any(mark in text for mark in _HOST_CALLBACK_MARKS)


def _tree_key(treedef: Any) -> tuple:
    """A pytree structure with its static data by type and exact value (`0.0` is not `-0.0`)."""
    return treedef, _aux_key(treedef)


def _key(stage: Any, lowered: Any, options: dict, placement: tuple) -> Any:
    """What identifies a compiled program completely, or None where nothing can: a digest
    of the lowered module's text (every operation and constant, nested jaxprs' included,
    shapes, shardings, precision), the trace's constants by value (nested ones too), the
    argument and result structures, the results' weak types, the compiler options, the
    backend and the arguments' placement. None for a program that calls back into Python
    (`holds_host_callback`). `stage` is traced with `keep_unused=True`: otherwise JAX drops
    the arguments nothing reads, and two programs that read different arguments of one shape
    print alike (the executable holds which ones it reads, the text does not)."""
    text = lowered.as_text()
    if holds_host_callback(text):
        return None
    results = tuple((r.shape, str(r.dtype), getattr(r, "weak_type", False)) for r in stage.jaxpr.out_avals)
    return (hashlib.blake2b(text.encode()).digest(), _values_key(_constants(stage.jaxpr)),
            _tree_key(lowered.in_tree), _tree_key(lowered.out_tree), results, tuple(sorted(options.items())),
            jax.default_backend(), placement)


class Kept:
    """At most `size` entries, the least recently used dropped first; safe across threads."""

    def __init__(self, size: int):
        self.size, self._lock = size, threading.Lock()
        self._entries: collections.OrderedDict = collections.OrderedDict()

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._entries[key] = value
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)


_EXECUTABLES = Kept(256)  # `_key` of a lowered program -> its compiled executable
# programs compiled, compilations reused by a later trace of the same program, and of the
# compiled ones those of whole checks (`run`; the others evaluate finite differences)
stats = {"compiled": 0, "reused": 0, "checks compiled": 0}


def compiled(stage: Any, leaves: list) -> Any:
    """The executable of a traced program (`jax.jit(f, keep_unused=True).trace(...)`, see
    `_key`): lowered every time, and compiled unless an executable of the same program
    (`_key`) is kept; `leaves`: the arguments it was traced with. Small programs on CPU
    compile with `_QUICK_OPTIONS`."""
    options = _quick_options() if _is_small(leaves) else {}
    lowered = stage.lower()
    key = _key(stage, lowered, options, tuple(getattr(leaf, "sharding", None) for leaf in leaves))
    program = None if key is None else _EXECUTABLES.get(key)
    if program is not None:
        stats["reused"] += 1
        return program
    program = lowered.compile(compiler_options=options) if options else lowered.compile()
    stats["compiled"] += 1
    if key is not None:
        _EXECUTABLES.put(key, program)
    return program


def _signature(args: tuple) -> tuple:
    """What a `jit` call's trace depends on besides the function: the argument structure
    and each leaf's type, shape, dtype, weak type and placement (a non-array leaf by
    type and exact value, as `jax.jit` keys a static one)."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    return _tree_key(treedef), tuple((type(leaf) is np.ndarray, np.shape(leaf), str(leaf.dtype),
                                      getattr(leaf, "weak_type", False), getattr(leaf, "sharding", None))
                                     if isinstance(leaf, _ARRAYS) else (type(leaf), repr(leaf)) for leaf in leaves)


class jit:
    """`jax.jit(fn)` for a check: `jax.jit`'s own reuse for this function object (a trace per
    argument signature, kept while the object lives, so only functions whose behaviour is
    fixed when made may be wrapped: the finite differences' evaluations of one traced
    jaxpr) and, across objects, `compiled`'s: another object that traces to the same
    program runs the kept executable. Small programs on CPU compile with `_QUICK_OPTIONS`.
    """

    def __init__(self, fn: Callable):
        self.fn = fn
        self._programs: dict = {}

    def __call__(self, *args: Any) -> Any:
        signature = _signature(args)
        program = self._programs.get(signature)
        if program is None:
            stage = jax.jit(self.fn, keep_unused=True).trace(*args)
            program = compiled(stage, jax.tree_util.tree_leaves(args))
            self._programs[signature] = program
        return program(*args)


class Program:
    """`body(*args)` traced once as a program of the array leaves of `args` (every other leaf
    fixed, as in a closure) and compiled (`compiled`). Called, it runs that executable at
    arguments that differ from `args` in array values only (the same structure, the same
    objects elsewhere, arrays of the same shapes and dtypes): `body` at another point of the
    same check without a new trace, as `jax.jit` calls one executable at other values. The
    result is `body`'s, its arrays concrete."""

    def __init__(self, body: Callable, *args: Any):
        leaves, self.treedef = jax.tree_util.tree_flatten(args)
        self.where = [k for k, leaf in enumerate(leaves) if _is_array(leaf)]
        self.fixed = [(k, leaf) for k, leaf in enumerate(leaves) if not _is_array(leaf)]
        dynamic = [leaves[k] for k in self.where]
        self.kinds = [(np.shape(d), d.dtype) for d in dynamic]
        self.traced = _Traced(body, leaves, self.treedef, self.where)
        stage = jax.jit(self.traced, keep_unused=True).trace(*dynamic)
        before = stats["compiled"]
        self.program = compiled(stage, dynamic)
        stats["checks compiled"] += stats["compiled"] - before

    def __call__(self, *args: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(args)
        dynamic = [leaves[k] for k in self.where] if treedef == self.treedef else []
        if (treedef != self.treedef or any(leaves[k] is not leaf for k, leaf in self.fixed)
                or [(np.shape(d), d.dtype) for d in dynamic] != self.kinds):
            raise ValueError("a compiled check's program was called at arguments it was not traced for "
                             "(another structure, fixed value, shape or dtype): trace it anew")
        return self.traced.result(self.program(*dynamic))


def run(body: Callable, *args: Any) -> Any:
    """`body(*args)` traced as one program of the array leaves of `args` (every other leaf
    fixed, as in a closure) and run compiled; the result is `body`'s, its arrays concrete.

    `body` runs, traced, on every call (exceptions it raises propagate); the compilation is
    reused where an earlier call traced to the same program (`compiled`), with the same
    constants: arrays the body closed over or made, such as the testers' seeded random
    tangents, are compiled into it. `Program(body, *args)` keeps the program to run again.
    """
    return Program(body, *args)(*args)
