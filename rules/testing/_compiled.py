"""Compiled evaluations for the testers: one `jax.jit` program per check, compiled once.

Evaluated eagerly, every operation of a rule compiles on its own (per shape, dtype and the
context JAX runs it in): a linear-algebra rule and its pullback cost about a hundred small
compilations, each as slow as one program holding all of them. The testers therefore trace
each check (the rule and its conventions, the lowered primitive under jit and vmap) into one
program. A repeated check reuses its trace and program while the `fingerprint` of what it
runs is the same (the code, the values it reads, the registered rules, JAX's configuration;
`_fingerprint`) at arguments of the same shapes and dtypes: nothing stale is checked, and a
warm check costs a run of the program. Otherwise it traces anew, so the checks of conventions
run, and the compilation is reused by a program that traces to the same jaxpr with the same
constants (the testers' random tangents come from fixed seeds, so a repeated check has the
same ones). A program is compiled from its one trace, so nothing is traced twice.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import warnings
from typing import Any, Callable, Iterator

import jax
import jax.extend
import numpy as np

from ._fingerprint import _Id as _ByIdentity  # an object keyed by identity (held)
from ._fingerprint import fingerprint

__all__ = ["jit", "program_key", "run"]

_ARRAYS = (jax.Array, np.ndarray, np.generic)


def jit(fn: Callable) -> Callable:
    """`jax.jit(fn)` for a check: on CPU, small inputs compile with `_QUICK_OPTIONS`.

    A check runs each program a few times, on tiny inputs in most checks, where compiling is
    nearly all of the cost. The quick options keep XLA's passes over the program (what it
    computes, and in which precision) and change how the CPU code is generated: no LLVM
    optimization of it, XLA's elemental loop emitter for fused element-wise code instead of
    the fusion emitters, and the module generated in one piece. Compiling the library's
    check programs takes 2.5x less time that way (`benchmarks/check.py`); a result may
    differ from the default compilation's in the last bits of a transcendental function,
    far below any tester's tolerance. From `_OPTIMIZED_FROM` input elements on, running the
    code is what costs, and it is compiled as usual (the unoptimized code of an exact check
    at 10^4 elements runs 4x slower). Other backends compile as usual. An option this XLA
    does not know is left out (`_quick_options`).
    """
    optimized = jax.jit(fn)
    options = _quick_options()
    if not options:
        return optimized
    quick = jax.jit(fn, compiler_options=options)

    def call(*args: Any) -> Any:
        return (quick if _is_small(jax.tree_util.tree_leaves(args)) else optimized)(*args)

    return call


_OPTIMIZED_FROM = 4096


def _is_small(leaves: list) -> bool:
    """Fewer than `_OPTIMIZED_FROM` input elements: compiling costs more than running."""
    return sum(int(np.size(leaf)) for leaf in leaves) < _OPTIMIZED_FROM

# XLA:CPU debug options for programs compiled quickly, each measured on the library's
# check programs (948 of them): 115 ms per compilation with none, 98 ms at optimization
# level 0, 43 ms with all three.
_QUICK_OPTIONS: dict[str, Any] = {
    "xla_backend_optimization_level": 0,  # no LLVM optimization of the generated code
    "xla_cpu_use_fusion_emitters": False,  # fused element-wise loops by the elemental emitter
    "xla_cpu_parallel_codegen_split_count": 1,  # one LLVM module, not one per thread
}
_SUPPORTED: list[dict[str, Any]] = []


def _quick_options() -> dict[str, Any]:
    """`_QUICK_OPTIONS` that this JAX and XLA accept, on CPU; `{}` elsewhere."""
    if not _SUPPORTED:
        _SUPPORTED.append(_accepted(_QUICK_OPTIONS) if jax.default_backend() == "cpu" else {})
    return _SUPPORTED[0]


def _accepted(options: dict[str, Any]) -> dict[str, Any]:
    """The entries of `options` with which XLA compiles a small program: XLA renames and
    retires its debug options between releases (an unknown one is an error), and
    `jax.jit` takes `compiler_options` from JAX 0.4.36 on."""
    import inspect

    if "compiler_options" not in inspect.signature(jax.jit).parameters:
        return {}
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
        full = list(self.leaves)
        for k, d in zip(self.where, dynamic):
            full[k] = d
        out = self.body(*jax.tree_util.tree_unflatten(self.treedef, full))
        out_leaves, self.out_tree = jax.tree_util.tree_flatten(out)
        self.is_traced = [isinstance(leaf, jax.core.Tracer) for leaf in out_leaves]
        self.kept = [None if t else leaf for leaf, t in zip(out_leaves, self.is_traced)]
        return [leaf for leaf, t in zip(out_leaves, self.is_traced) if t]


def program_key(jaxpr: Any) -> tuple:
    """What makes two traced programs the same: the jaxpr's text, and, by identity, the
    Python callables in its equations' parameters (host callbacks, custom rules), which the
    text names but does not tell apart (two different SciPy functions behind
    `rules.external` print alike). A new callable gives a new key: compiled anew."""
    found: list[Any] = []

    def visit(value: Any) -> None:
        # one class since jax 0.11 (a ClosedJaxpr's `.jaxpr` is itself there); both have `eqns`
        if isinstance(value, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
            for eqn in value.eqns:
                for param in eqn.params.values():
                    visit(param)
        elif isinstance(value, (tuple, list)):
            for item in value:
                visit(item)
        elif hasattr(value, "__rules_program_key__"):  # a primitive with its rules (rules._dual)
            found.extend(map(_ByIdentity, value.__rules_program_key__()))
            try:
                expansion = value.__rules_expansion__()
            except Exception:  # cannot be traced alone: never reuse a program holding it
                found.append(_ByIdentity(value))
            else:
                found.append(str(expansion))
                visit(expansion)
        elif callable(value) and not isinstance(value, type):
            found.append(_ByIdentity(value))

    visit(jaxpr)
    return str(jaxpr), tuple(found)


def _values_key(consts: list) -> tuple:
    """The constants a program was traced with, by value: they are compiled into it. A
    typed PRNG key counts by its key data; any other constant NumPy cannot read, by
    identity (JAX arrays are immutable: the same object has the same values)."""
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
        out.append((str(dtype if dtype is not None else a.dtype), a.shape, a.tobytes()))
    return tuple(out)


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


_PROGRAMS = Kept(128)  # (program_key, values of the constants) -> compiled program
_TRACES = Kept(128)  # trace key -> (program, output snapshot, warnings raised while tracing)
# programs compiled, runs that reused one, and runs that reused a trace (for tests)
stats = {"compiled": 0, "reused": 0, "reused trace": 0}


def run(body: Callable, *args: Any) -> Any:
    """`body(*args)` traced as one program of the array leaves of `args` (every other leaf
    fixed, as in a closure) and run compiled; the result is `body`'s, its arrays concrete.

    A repeated call whose `fingerprint` (of `body` and the fixed leaves: the code it runs and
    the values that code reads) and array shapes and dtypes are those of an earlier call
    reuses that call's trace and program: `body` does not run. Otherwise `body` runs traced,
    and exceptions it raises propagate. Where there is no fingerprint, the compiled program
    is still reused by a call that traces to the same jaxpr with the same constants (arrays
    the body closed over or made, such as the testers' seeded random tangents), which are
    compiled into it; where there is one, that search is skipped (printing the jaxpr for its
    key cost more than the compilations it found: 2 of 329 in `python -m rules check`). The
    program is compiled from its one trace: nothing is traced twice.
    """
    leaves, treedef = jax.tree_util.tree_flatten(args)
    where = [k for k, leaf in enumerate(leaves) if _is_array(leaf)]
    dynamic = [leaves[k] for k in where]
    trace_key = _trace_key(body, leaves, treedef, where, dynamic)
    hit = None if trace_key is None else _TRACES.get(trace_key)
    if hit is not None:
        stats["reused trace"] += 1
        program, snapshot, warned = hit
        replay_warnings(warned)
        return _rebuild(snapshot, program(*dynamic))
    traced = _Traced(body, leaves, treedef, where)
    with recording_warnings() as warned:
        stage = jax.jit(traced).trace(*dynamic)
    program = None
    if trace_key is None:  # no fingerprint: find a compilation by the jaxpr and its constants
        key = (program_key(stage.jaxpr.jaxpr), _values_key(stage.jaxpr.consts))
        program = _PROGRAMS.get(key)
        if program is not None:
            stats["reused"] += 1
    if program is None:
        options = _quick_options() if _is_small(dynamic) else {}
        lowered = stage.lower()
        program = lowered.compile(compiler_options=options) if options else lowered.compile()
        stats["compiled"] += 1
        if trace_key is None:
            _PROGRAMS.put(key, program)
    snapshot = (traced.out_tree, traced.is_traced, traced.kept)
    if trace_key is not None:
        _TRACES.put(trace_key, (program, snapshot, warned))
    return _rebuild(snapshot, program(*dynamic))


@contextlib.contextmanager
def recording_warnings() -> Iterator[list]:
    """Warnings raised while tracing, recorded and then raised again (as they were, through
    the filters in force), so that a reuse of the trace can raise them too: a rule that warns
    when traced warns on every check, reused or not (`pytest.warns` sees it either way).
    Printing while traced happens on the first check only, as with `jax.jit`."""
    recorded: list = []
    try:
        with warnings.catch_warnings(record=True) as recorded:
            yield recorded
    finally:
        replay_warnings(recorded)


def replay_warnings(caught: list) -> None:
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def _trace_key(body: Callable, leaves: list, treedef: Any, where: list[int], dynamic: list) -> Any:
    """What `run` keys a reusable trace on: the fingerprint of `body`, the fixed leaves and
    the tree, and each array's shape, dtype, weak type and placement. None: not reusable."""
    fixed = set(where)
    token = fingerprint(body, [leaf for k, leaf in enumerate(leaves) if k not in fixed], treedef)
    if token is None:
        return None
    avals = tuple((type(a) is np.ndarray, np.shape(a), str(a.dtype), getattr(a, "weak_type", False),
                   getattr(a, "sharding", None)) for a in dynamic)
    return token, avals


def _rebuild(snapshot: tuple, values: list) -> Any:
    """A traced body's result from its program's outputs: the traced leaves from `values`,
    the others (Python values the trace made) as the trace left them."""
    out_tree, is_traced, kept = snapshot
    it = iter(values)
    leaves = [next(it) if t else leaf for leaf, t in zip(kept, is_traced)]
    return jax.tree_util.tree_unflatten(out_tree, leaves)
