"""`test_rrule`, `test_frule`, `test_scalar`: rules checked against finite differences.

Each tester checks the rule itself (conventions, arity, dtypes, shapes, values against
finite differences in float64) and then the lowered primitive (`jax.vjp`/`jax.jvp` of it,
under `jax.jit`, and `jax.vmap` batched against a Python loop). Failures raise
`AssertionError` with a message that names the rule, the argument and its pytree path, and
shows expected against got; success returns a `RuleReport`.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import functools
import math
import time
from typing import Any, Callable, NamedTuple, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

from .._dual import forward_mode_required
from .._errors import ForwardModeError, RuleDefinitionError, describe_argument, format_message
from .._notimplemented import NotImplementedTangent
from .._primitive import Primitive, unwrap
from .._projection import is_differentiable_leaf, tangent_dtype
from .._registry import frule, function_name, rrule
from .._via_ad import frule_via_ad, rrule_via_ad
from .._boundary import _tangent_leaves, conj, conj_tree, filled
from .._lowering import lowered_rules
from .._thunks import AbstractThunk, InplaceableThunk, Thunk, unthunk
from .._zeros import AbstractZero, NoTangent, ZeroTangent
from ._compiled import Program, _is_small
from ._compiled import run as run_compiled
from ._compare import (
    WithTangent, _perturbable, compare_trees, default_tolerance, dense_like, mask_leaves, not_implemented_mask,
    rand_tangent, _norm, host_dot, leaf_at, random_values, test_approx, tolerances, without_not_implemented
)
from ._finite_differences import (
    FDMethod, _fd_inner_jvps, _fd_jvp_by_coordinates, _fd_jvps, _shorter_spans, _sided, _vector, _x64, central_fdm,
    fd_jacobian, fd_vjp,
)

__all__ = ["RuleReport", "test_rrule", "test_frule", "test_scalar"]

# Input elements up to which "auto" computes the full J^T y_bar, compared entry by entry
# (why 256: rules/testing/README.md).
EXACT_MODE_LIMIT = 256
_DEFAULT_FDM = central_fdm(5, 1)  # made once: its coefficients are exact fractions, ~0.2 ms to make


@dataclasses.dataclass(frozen=True)
class RuleReport:
    """What a tester checked: the rule, its mode, the largest relative error, and the time."""

    function: str
    kind: str
    mode: str
    max_error: float
    checks: tuple[str, ...]
    seconds: float
    modes: str = ""  # the modes JAX gets from the primitive: "fwd+rev" or "rev"


# The function under test, so that messages name its parameters ("argument 1 (x)").
_tested: contextvars.ContextVar[Any] = contextvars.ContextVar("rules_tested", default=None)
# Whether it is checked through JAX's own derivative (a jax.custom_vjp, custom_jvp or plain
# JAX function, no rule of ours), so that a fix names what to change there.
_via_jax: contextvars.ContextVar[bool] = contextvars.ContextVar("rules_via_jax", default=False)


def _arg(index: int, path: str = "") -> str:
    if index == -1:  # the function itself: a callable with differentiable fields
        return "the function itself (f_bar)" + (f" at path {path}" if path else "")
    return describe_argument(index, path, fn=_tested.get())


def _full_precision(tester: Callable) -> Callable:
    """Run a tester with float32 matmuls at full precision: GPUs default to TF32 products
    (about 1e-3 relative error), which would fail a correct float32 rule against float64
    finite differences; the testers check the rule's mathematics, as CPUs evaluate it."""

    @functools.wraps(tester)
    def at_full_precision(*args: Any, **kwargs: Any) -> Any:
        with jax.default_matmul_precision("highest"):
            return tester(*args, **kwargs)

    return at_full_precision


def _fail(tester: str, name: str, what: str, cause: BaseException | None = None, **sections: Any) -> NoReturn:
    failure = AssertionError(format_message(f"{tester}({name}): {what}", **sections))
    if cause is not None:
        raise failure from cause
    raise failure


# ----- arguments ------------------------------------------------------------------------------
def _unpack(args: tuple, seed: int) -> tuple[tuple, tuple]:
    rng = np.random.default_rng(seed)  # drawn in order, for the unmarked arguments only
    pairs = [(a.primal, a.tangent) if isinstance(a, WithTangent) else (a, _held_zero(rand_tangent(a, seed=rng), a))
             for a in args]
    return tuple(p for p, _ in pairs), tuple(t for _, t in pairs)


def _held_zero(t: Any, primal: Any) -> Any:
    """`t` with zeros where `primal` is infinite or NaN: finite differences hold those
    entries constant, so no direction moves them and no cotangent of them is compared."""

    def zero(leaf_t, leaf):
        if not is_differentiable_leaf(leaf) or isinstance(leaf_t, (AbstractZero, NotImplementedTangent)):
            return leaf_t
        finite = np.isfinite(np.asarray(leaf))
        return leaf_t if finite.all() else np.where(finite, np.asarray(leaf_t), 0).astype(np.asarray(leaf_t).dtype)

    try:
        return jax.tree_util.tree_map(zero, t, primal)
    except (ValueError, TypeError):  # not shaped like the primal (NoTangent, a Tangent): as it is
        return t


def _upcast(tree: Any) -> Any:
    """The float leaves in float64 (complex128), also where JAX's default has no float64."""

    def up(leaf):
        if isinstance(leaf, (jax.Array, np.ndarray, np.generic)) and jnp.issubdtype(leaf.dtype, jnp.inexact):
            wide = jnp.complex128 if jnp.iscomplexobj(leaf) else jnp.float64
            return jnp.asarray(leaf, wide)
        return leaf

    with _x64("the testers"):
        return jax.tree_util.tree_map(up, tree)


def _traced_numbers(tree: Any) -> Any:
    """Python floats and complex numbers as weakly typed JAX scalars: a check's program traces them as
    `jax.jit` does, never folds them in (XLA's folded complex tan near pi/2 is 5e-9 off its kernel's)."""
    return jax.tree_util.tree_map(lambda leaf: jnp.asarray(leaf) if type(leaf) in (float, complex) else leaf, tree)


# Keyword arguments of the testers themselves; test_scalar passes the others on to f.
_TESTER_OPTIONS = frozenset({
    "output_tangent", "rtol", "atol", "fdm", "check_jit", "check_vmap", "check_thunked_output_tangent",
    "mode", "seed", "rrule_f", "frule_f",
})


def _has(table: Any, f: Any, primals: tuple) -> bool:
    """Whether a rule of `table` applies; an unhashable callable carries none."""
    try:
        return table.lookup(f, primals) is not None
    except TypeError:  # rules are keyed by the callable: an unhashable one has none
        return False


def _unlowered(f: Any, problem: _Problem) -> str | None:
    """Why the lowered primitive of `f` cannot be checked, or None."""
    if problem.f_perturbed:
        return "lowered primitive not checked: f has a tangent, and JAX differentiates arguments only"
    try:
        hash(f)
    except TypeError:
        return "lowered primitive not checked: f is unhashable, so no rule can be keyed on it"
    return None


def _call_rule(tester: str, name: str, kind: str, call: Callable[[], Any]) -> tuple:
    """The rule's result `(y, pullback)` / `(y, y_dot)`; a broken convention is a failure."""
    shape = "(y, pullback)" if kind == "rrule" else "(y, y_dot)"
    try:
        result = call()
    except RuleDefinitionError as err:
        _fail(tester, name, f"the {kind} does not follow ChainRules' conventions",
              expected=f"a pair {shape}", got=str(err).replace("\n", "\n            "))
    if result is None:
        _fail(tester, name, f"no {kind} applies (the rule function returned None)", expected=f"a pair {shape}")
    if not (isinstance(result, tuple) and len(result) == 2):
        _fail(tester, name, f"the {kind} must return {shape}",
              expected=f"a pair {shape}", got=f"{type(result).__name__}"
              + (f" of length {len(result)}" if isinstance(result, tuple) else ""))
    return result


def _evaluated(t: Any) -> Any:
    """`t` with every thunk in it evaluated, once (NotImplementedTangents kept)."""
    return jax.tree_util.tree_map(lambda v: _evaluated(unthunk(v)) if isinstance(v, AbstractThunk) else v, unthunk(t),
                                  is_leaf=lambda v: isinstance(v, AbstractThunk))


def _zero_like(x: Any) -> Any:
    """A natural zero tangent of x (zeros in its structure), or NoTangent() if it has none."""
    if not _perturbable(x):
        return NoTangent()
    return jax.tree_util.tree_map(lambda leaf: jnp.zeros_like(leaf) if is_differentiable_leaf(leaf) else leaf, x)


class _Problem:
    """f with its non-perturbed arguments fixed: a function of the perturbed ones only.

    Slots are argument indices (0-based), and -1 for the function itself when it has
    differentiable fields and a tangent (a callable struct), as ChainRulesTestUtils'
    `call(f, xs...)` perturbs f too.
    """

    def __init__(self, f: Callable, primals: tuple, tangents: tuple, fkwargs: dict, f_dot: Any = NoTangent()):
        self.f, self.primals, self.fkwargs = f, primals, fkwargs
        # f has no rules: JAX differentiates f itself (its custom_vjp / custom_jvp, or its code)
        self.plain = not isinstance(f, Primitive) and not (_has(rrule, f, primals) or _has(frule, f, primals))
        self.f_perturbed = _perturbable(f) and not isinstance(f_dot, NoTangent)
        self.index = ([-1] if self.f_perturbed else []) + [i for i, (x, t) in enumerate(zip(primals, tangents))
                                                            if _perturbable(x) and not isinstance(t, NoTangent)]
        self.raw = unwrap(f)
        every = (f_dot, *tangents)
        self.args = tuple(self.primal(i) if i < 0 else _traced_numbers(self.primal(i)) for i in self.index)
        self.tangents = tuple(dense_like(every[1 + i], self.primal(i)) for i in self.index)

    def primal(self, i: int) -> Any:
        return self.f if i < 0 else self.primals[i]

    def without(self, drop: set) -> _Problem:
        """The same problem with the slots in `drop` fixed (not perturbed)."""
        keep = [k for k, i in enumerate(self.index) if i not in drop]
        new = copy.copy(self)
        new.index, new.args = [self.index[k] for k in keep], tuple(self.args[k] for k in keep)
        new.tangents = tuple(self.tangents[k] for k in keep)
        new.f_perturbed = -1 in new.index
        return new

    def merge(self, dargs: tuple) -> list:
        full = [self.f, *self.primals]
        for i, d in zip(self.index, dargs):
            full[1 + i] = d
        return full

    def raw_fn(self, *dargs):
        f, *full = self.merge(dargs)
        return unwrap(f)(*full, **self.fkwargs)

    def size(self) -> int:
        return sum(np.size(l) * (2 if jnp.iscomplexobj(l) else 1) for l in jax.tree_util.tree_leaves(self.args) if is_differentiable_leaf(l))


def _jax_seed(y_bar_dense: Any, y: Any) -> Any:
    """A ChainRules cotangent as JAX's vjp seed: conjugated, float0 for int outputs."""

    def seed(yb, leaf):
        if not is_differentiable_leaf(leaf):
            return np.zeros(np.shape(leaf), jax.dtypes.float0)
        return conj(yb) if jnp.iscomplexobj(leaf) else jnp.asarray(yb, jnp.result_type(leaf))

    return jax.tree_util.tree_map(seed, y_bar_dense, y)


def _jax_tangents(tangents: Any, args: Any) -> Any:
    """Dense tangents as `jax.jvp` takes them: float0 zeros for the int and bool leaves."""

    def tangent(t, leaf):
        if is_differentiable_leaf(leaf) or not isinstance(leaf, (int, np.ndarray, np.generic, jax.Array)):
            return t
        return np.zeros(np.shape(leaf), jax.dtypes.float0)

    return jax.tree_util.tree_map(tangent, tangents, args)


def _real_inner(a: Any, b: Any) -> tuple[float, float]:
    """Re<a, b> over the float leaves, and the sum of the absolute terms (a scale)."""
    total, scale = 0.0, 0.0
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        if not is_differentiable_leaf(x) or not is_differentiable_leaf(y):
            continue
        x, y = np.asarray(x), np.asarray(y)
        if np.iscomplexobj(x) or np.iscomplexobj(y):  # Re(conj(x) y), without a complex product
            terms = np.real(x).astype(np.float64) * np.real(y) + np.imag(x).astype(np.float64) * np.imag(y)
            total += float(np.sum(terms))
            scale += float(np.sum(np.abs(terms)))
        else:  # sum |x_i y_i| = <|x|, |y|>: two dot products, no array of terms
            x, y = np.ravel(x).astype(np.float64, copy=False), np.ravel(y).astype(np.float64, copy=False)
            total += host_dot(x, y)
            scale += host_dot(np.abs(x), np.abs(y))
    return total, scale


def _tree_norm(tree: Any) -> float:
    """The 2-norm of the float leaves of a tree, taken together."""
    return math.sqrt(sum(_norm(leaf) ** 2 for leaf in jax.tree_util.tree_leaves(tree) if is_differentiable_leaf(leaf)))


def _lowered_tol(*trees: Any) -> tuple[float, float]:
    rtol, _ = default_tolerance(*trees)
    return (2e-5, 1e-6) if rtol > 1e-6 else (1e-9, 1e-12)


# Relative sizes tried for the second point of the jax.vmap checks, largest first. The first
# whose results are finite wherever the first point's are keeps f inside its domain (arccos
# at 0.99 must not be moved past 1); 0 repeats the point, and the batch still differs in its
# seed (y_bar or the tangents).
_VMAP_STEPS = (1e-3, 1e-6, 0.0)


def _finite_pattern(tree: Any) -> list[np.ndarray]:
    return [np.isfinite(np.asarray(l)) for l in jax.tree_util.tree_leaves(tree) if is_differentiable_leaf(l)]


def _element(tree: Any, k: int) -> Any:
    """Batch element k of a batch of two (on the host: indexing a device array eagerly
    compiles a program)."""
    return jax.tree_util.tree_map(lambda b: _on_host(b)[k], tree)


def _check_close(tester, name, what, got, expected, rtol, atol, argument=None, entrywise=False) -> float:
    """Fail unless `got` matches `expected` leaf by leaf; NaN where both have it matches (the
    same value computed twice, or an entry neither the rule nor the differences define).
    `entrywise`: by the largest entry, not the 2-norm (`_compare._leaf_error`)."""
    worst, bad = compare_trees(got, expected, rtol, atol, equal_nan=True, entrywise=entrywise)
    if bad:
        path = bad[0]
        where = argument if path == "" else (f"{argument} at path {path}" if argument else f"leaf {path}")
        shown = lambda t: np.array2string(np.asarray(leaf_at(t, path)), precision=10, threshold=12).replace("\n", " ")
        _fail(tester, name, what, argument=where, expected=shown(expected),
              got=f"{shown(got)}  (relative error {worst:.3g}; rtol={rtol:g}, atol={atol:g})")
    return worst


def _check_dtypes(tester, name, t, primal, index) -> None:
    """Each leaf of the tangent `t` has exactly its primal leaf's shape and tangent dtype."""
    leaves = jax.tree_util.tree_leaves(primal)
    parts = _tangent_leaves(t, primal, [is_differentiable_leaf(l) for l in leaves], name, index, ())
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(primal)[0]]
    for leaf, part, path in zip(leaves, parts, paths):
        if part is None or isinstance(part, AbstractZero):
            continue
        part = unthunk(part)
        want_shape, want_dtype = np.shape(leaf), tangent_dtype(leaf)
        got_dtype = np.dtype(jnp.result_type(part))
        if np.shape(part) != want_shape or (got_dtype != want_dtype and not isinstance(part, (float, complex))):
            _fail(tester, name, "the rule's tangent does not have its primal's shape and dtype", argument=_arg(index, path),
                  expected=f"shape {want_shape}, dtype {want_dtype}", got=f"shape {np.shape(part)}, dtype {got_dtype}",
                  fix=("return it in its primal's dtype from the custom rule (`g.astype(x.dtype)` in a "
                       "custom_vjp's bwd or a custom_jvp's rule): JAX does not check it" if _via_jax.get() else
                       "project it: `project_x = ProjectTo(x)` in the rule, `project_x(dx)` in the pullback "
                       "(sums broadcast dimensions? reduce them first)"))


class _RruleSpec(NamedTuple):
    """What `_rrule_body` reads besides its arguments: fixed while it is traced."""

    name: str
    f: Any
    rrule_f: Any
    seed: int
    indices: tuple  # not `index`, which would shadow tuple.index (here and in the specs below)
    check_thunked: bool
    lowered: _InProgram | None = None  # the lowered primitive's checks, traced into the same program


class _InProgram(NamedTuple):
    """The lowered primitive's checks that `test_rrule` and `test_frule` trace into the rule's
    own program (`_lowered_in_program`), one compilation per tester call; where anything of
    it fails in the program, the check runs on its own, which reports why."""

    prim: Any
    vmap: bool
    transposition: bool  # an rrule without an frule: jax.jvp by the transposed pullback too
    second: bool = False  # jax.vmap's unbatched value at its second point computed here (large inputs)


def _lowered_in_program(spec: _InProgram, what: str, ps: tuple, fkwargs: dict, idx: tuple, other: Any,
                        tangents: dict, partner: dict | None) -> tuple | None:
    """Inside the rule's program: the lowered primitive's `jax.{what}` at the arguments `idx`
    (`other`: y_bar or the tangents); with `spec.vmap` batched with the second point
    `partner`, seed doubled; with `spec.transposition` its jax.jvp by the transposed pullback
    ("rev" where JAX cannot transpose it); with `spec.second`, `(unbatched at the second
    point, batched)`. None where it cannot be traced here."""
    if not idx:
        return None
    a0 = tuple(ps[i] for i in idx)
    fn = functools.partial(_LOWERED[what], spec.prim, idx, ps, fkwargs)
    try:
        a1 = tuple((partner or {})[i] for i in idx)
        result = (_variants_body(_VariantsSpec(what, spec.prim, idx, True), ps, fkwargs, a0, other, a1)
                  if spec.second else _pair(fn, a0, a1, other) if spec.vmap else fn(a0, other))
    except Exception:  # noqa: BLE001 - `_Test.check_variants` runs it on its own and reports why
        return None
    forward: tuple | None = None
    if spec.transposition:
        try:
            with forward_mode_required():  # a pullback JAX cannot transpose raises here, not when compiled
                y_dot = _variants_body(_VariantsSpec("jvp", spec.prim, idx, True), ps, fkwargs, a0,
                                       tuple(tangents[i] for i in idx))[1]
            forward = ("fwd+rev", y_dot)
        except ForwardModeError:
            forward = ("rev", None)
        except Exception:  # noqa: BLE001 - checked on its own, as above
            forward = None
    return idx, result, forward


def _on_host(a: Any) -> Any:
    """A concrete JAX array as NumPy (each eager jax.numpy operation on it would dispatch, and
    compile once per shape); a tracer, NumPy array or Python number as it is."""
    return np.asarray(a) if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer) else a


def _stacked(t0: Any, t1: Any) -> Any:
    """Two points as a batch of two along the differentiable leaves (the others kept), in
    NumPy where both are concrete arrays."""
    def stack(a, b):
        if not is_differentiable_leaf(a):
            return a
        a, b = _on_host(a), _on_host(b)
        return np.stack([a, b]) if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) else jnp.stack([a, b])

    return jax.tree_util.tree_map(stack, t0, t1)


def _partner(problem: _Problem, seed: int, scale: float) -> dict:
    """The jax.vmap check's second point: each perturbed argument's float leaves moved by
    `scale` of themselves in a random direction (the same for the same seed), in NumPy where
    they are arrays (eager jax.numpy would compile a program per operation and shape)."""
    rng = np.random.default_rng(seed + 3)

    def move(leaf):
        if not is_differentiable_leaf(leaf):
            return leaf
        x = np.asarray(leaf) if isinstance(leaf, (jax.Array, np.ndarray, np.generic)) else jnp.asarray(leaf)
        return (x + scale * random_values(x, rng) * np.where(np.isfinite(x), x, 0)).astype(x.dtype)  # inf stays

    return dict(zip(problem.index, jax.tree_util.tree_map(move, problem.args)))


def _slot(f: Any, ps: tuple, i: int) -> Any:
    return f if i < 0 else ps[i]


def _trace_of_f(problem: _Problem) -> Any:
    """f's jaxpr at the problem's point and its output shapes (`jax.make_jaxpr`'s
    `return_shape`), one trace per tester call; None where f cannot be traced."""
    raw, ps, fkwargs = problem.raw, problem.primals, problem.fkwargs
    try:
        return jax.make_jaxpr(lambda: raw(*ps, **fkwargs), return_shape=True)()
    except Exception:  # noqa: BLE001 - not traceable: the checks that trace it report why
        return None


def _output_seed(trace: Any, seed: int) -> Any:
    """`rand_tangent` of f's output made from its shapes before the rule's program is traced
    (the same values), an argument of the program, not a constant in its text; None where f
    cannot be traced (the rule's body makes it then)."""
    return None if trace is None else rand_tangent(
        jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), trace[1]), seed=seed + 1)


class _RruleResult(NamedTuple):
    """What `_rrule_body` computed (a pytree: it comes out of the compiled program)."""

    y: Any  # the rule's primal output
    y_expected: Any  # f(*args) itself
    y_bar_dense: Any  # the seed, dense
    dense: dict  # slot -> the cotangent, dense (NotImplemented leaves zero)
    masks: dict  # slot -> which leaves are NotImplemented, for a slot partly so
    broken: list  # slots wholly NotImplemented
    inplace: list  # (slot, path, add_fn(acc), acc + val) per InplaceableThunk
    again: dict  # slot -> the cotangent for a thunked seed
    lowered: tuple | None = None  # the lowered primitive's checks (`_lowered_in_program`)


def _rrule_body(spec: _RruleSpec, ps: tuple, fkwargs: dict, output_tangent: Any,
                tangents: dict | None = None, partner: dict | None = None) -> _RruleResult:
    """The rrule, its pullback and the checks of their conventions (types, arity, shapes and
    dtypes); what needs values comes back, as dense arrays, to be compared by `test_rrule`.
    With `spec.lowered`, the lowered primitive's checks too (`tangents`: the dense tangent
    of each perturbed slot, for forward mode; `partner`: the second point of jax.vmap's)."""
    tester, name, f = "test_rrule", spec.name, spec.f
    y, pullback = _call_rule(tester, name, "rrule", lambda: (spec.rrule_f or rrule)(f, *ps, **fkwargs))
    y_bar = rand_tangent(y, seed=spec.seed + 1) if output_tangent is None else output_tangent
    cts = _check_arity(tester, name, pullback(y_bar), len(ps))
    out: dict = dict(y=y, y_expected=unwrap(f)(*ps, **fkwargs), y_bar_dense=dense_like(y_bar, y),
                     dense={}, masks={}, broken=[], inplace=[], again={})
    for i in range(-1, len(ps)):
        x, ct = _slot(f, ps, i), cts[1 + i]
        if i not in spec.indices:
            why = "function" if i < 0 else ("marked" if _perturbable(x) else "fixed")
            if why != "marked" or spec.rrule_f is not _jax_rrule:  # JAX gives every float argument one
                _check_no_tangent(tester, name, i, ct, why)
            continue
        parts = jax.tree_util.tree_flatten_with_path(ct, is_leaf=lambda t: isinstance(t, InplaceableThunk))[0]
        for path, part in parts:
            if isinstance(part, InplaceableThunk):
                out["inplace"].append((i, jax.tree_util.keystr(path), *_inplaceable_sums(tester, name, i, part, path)))
        value = _evaluated(ct)
        mask = not_implemented_mask(value, x)
        if mask and all(mask):
            out["broken"].append(i)
            continue
        value = without_not_implemented(value)
        _check_dtypes(tester, name, value, x, i)
        out["dense"][i] = dense_like(value, x, name=name, index=i)
        if any(mask):
            out["masks"][i] = mask
    if spec.check_thunked:
        again = _check_arity(tester, name, pullback(Thunk(lambda: y_bar)), len(ps))
        for i in out["dense"]:
            out["again"][i] = dense_like(without_not_implemented(again[1 + i]), _slot(f, ps, i))
    if spec.lowered is not None:
        idx = tuple(i for i in spec.indices if i not in out["broken"] and i not in out["masks"])
        out["lowered"] = _lowered_in_program(spec.lowered, "vjp", ps, fkwargs, idx, out["y_bar_dense"],
                                             tangents or {}, partner)
    return _RruleResult(**out)


# ----- test_rrule -----------------------------------------------------------------------------
@_full_precision
def test_rrule(f: Callable, *args: Any, output_tangent: Any = None, rtol: float | None = None, atol: float | None = None,
               fdm: FDMethod | None = None, check_jit: bool = True, check_vmap: bool = True,
               check_thunked_output_tangent: bool = True, mode: str = "auto", seed: int = 0,
               rrule_f: Callable | None = None, **fkwargs: Any) -> RuleReport:
    """Check the rrule of `f` at `args` against finite differences and through JAX.

    `f` is a `rules.primitive` (or has a registered rrule), or any JAX function: one with no
    rrule of ours (a `jax.custom_vjp`, a `jax.custom_jvp`, plain JAX code) has JAX's own
    `jax.vjp` checked, so its custom rule (report kind "jax.vjp"). Checks: a rule applies;
    its primal is `f(*args)`; the pullback gives `1 + nargs` cotangents, `NoTangent()` where
    nothing may be perturbed, each of its primal's shape and dtype and equal to finite
    differences; a thunked seed gives the same; `InplaceableThunk`s agree; the lowered
    primitive's `jax.vjp` equals the pullback under `jax.jit` and `jax.vmap`. How each is
    checked (finite differences in float64, in f's domain): rules/testing/README.md.

    Args:
      f: the function. A callable pytree with differentiable fields is perturbed like an
        argument and its `f_bar` checked; any other function must get `f_bar = NoTangent()`.
      *args: the point; `with_tangent(x, NoTangent())` marks an argument not differentiated.
      output_tangent: the seed `y_bar` (default: random; the int `seed` seeds every random tangent).
      rtol, atol: tolerances (default: by the lowest precision of the primals and output; the
        default atol, absolute, stands only where finite differences cannot resolve less).
      fdm: the finite-difference method (default `central_fdm(5, 1)`).
      check_jit: evaluate as one compiled program, traced on every call (False: eagerly, as an
        eager `jax.grad` calls the rule: for a rule that computes otherwise on concrete arrays).
      check_vmap: check the lowered primitive under `jax.vmap` too.
      check_thunked_output_tangent: check the pullback of `Thunk(lambda: y_bar)`.
      mode: "exact": all of `J^T y_bar`, entry by entry, so that an error in any one entry
        shows at its own size (1e-7 of the largest in float64, 1e-4 in float32); "fast":
        `<y_bar, J x_dot>` against `<x_bar, x_dot>` along one direction per argument: a
        relative error of the whole cotangent down to ~1e-7, one in one entry of n diluted
        to about 1/n; "auto": exact up to 256 input elements, fast above.
      rrule_f: replaces `rules.rrule`, as `rrule_f(f, *args, **fkwargs)`; e.g.
        `rules.rrule_via_ad`, JAX's own derivative in ChainRules' conventions.
      **fkwargs: keyword arguments of `f`, not differentiated.

    Returns:
      A `RuleReport`: the checks run, the mode, the largest relative error.

    Raises:
      AssertionError: a check failed; the message names the rule, the argument, expected vs got.

    >>> import jax.numpy as jnp, rules
    >>> @rules.primitive
    ... def cube(x):
    ...     return x ** 3
    >>> @cube.rrule
    ... def cube_rrule(x):
    ...     return cube(x), lambda y_bar: (rules.NoTangent(), y_bar * 3 * x ** 2)
    >>> test_rrule(cube, jnp.array([1.0, 2.0])).mode
    'exact'

    See also: `test_frule`, `test_scalar`, `with_tangent`, `test_approx`.
    """
    return _RruleTest(f, args, fkwargs, rrule_f, output_tangent=output_tangent, rtol=rtol, atol=atol, fdm=fdm,
                      mode=mode, seed=seed, check_jit=check_jit, check_vmap=check_vmap,
                      check_thunked=check_thunked_output_tangent).run()


class _Test:
    """One tester call: the problem, the rule evaluated (`ev`), and the checks so far; each
    `check_*` method is one named check, as in ChainRulesTestUtils, and a subclass's `run` makes
    them in order. Its `_prepare` sets what its rule's program needs (`spec`, `inputs`),
    `_evaluate` runs it."""

    tester = kind = ""
    table: Any = None  # the registry of the tester's kind of rule
    body: Callable  # the rule and its checks, traced into one program (`_rrule_body`, `_frule_body`)
    spec: Any  # fixed while `body` is traced
    inputs: tuple  # `body`'s arguments after `spec` (its partner added by `_arguments`)
    lowers = transposition = second = False  # `_InProgram`'s: which checks are traced into `body`
    derivative = ""  # what the rule gives, in messages
    derivatives: Callable[[Any], list]  # (argument, value) of each derivative in a result of `body`

    def __init__(self, f, args, fkwargs, given, *, rtol, atol, fdm, check_jit, check_vmap, seed, **options):
        self.start = time.perf_counter()
        f, f_dot, primals, tangents, self.via_jax = _start(self.tester, self.table, f, args, seed, given)
        self.f, self.name, self.seed, self.check_jit, self.check_vmap = f, function_name(f), seed, check_jit, check_vmap
        self.problem = _Problem(f, primals, tangents, fkwargs, f_dot)
        self.trace = _trace_of_f(self.problem)
        self.calls_custom_vjp = self.trace is not None and _calls_custom_vjp(self.trace[0].jaxpr)
        self.fdm, self.worst = fdm or _DEFAULT_FDM, 0.0
        self._prepare(given, f_dot, primals, tangents, fkwargs, **options)
        self.ev = self._evaluate()
        self.rtol, self.atol = tolerances(rtol, atol, primals, self.ev.y)
        self.atol_given = atol is not None
        jax_kind = "jax.vjp" if self.kind == "rrule" else "jax.jvp"
        self.checks: list[str] = [f"JAX's own derivative ({jax_kind}; f has no {self.kind})"] if self.via_jax else []

    def _prepare(self, given, f_dot, primals, tangents, fkwargs, **options) -> None:
        raise NotImplementedError

    def _evaluate(self) -> Any:
        """`body` at the inputs as one compiled program (`_compiled`); `self.program` kept where
        the lowered primitive's checks are traced into it (`_InProgram`), to run at a second
        point. That is tried first, then `body` alone, then (a rule that cannot be traced)
        `body` eagerly: the checks of the lowered primitive under `jax.jit` then say why."""
        problem, body, self.program = self.problem, functools.partial(self.body, self.spec), None
        self.vmap_in_program = self.check_jit and self.check_vmap and not problem.f_perturbed  # f's fields: fixed in it
        partner = _partner(problem, self.seed, _VMAP_STEPS[0]) if self.vmap_in_program else None
        args = _arguments(self, partner)
        candidates = [body] if self.check_jit else []
        if self.check_jit and problem.index and self.lowers:
            # on large inputs the second point's unbatched value is computed in the program
            # (one more derivative) rather than by running the whole program there
            self.second = self.vmap_in_program and not _is_small(jax.tree_util.tree_leaves(problem.args))
            candidates.insert(0, functools.partial(self.body, self.spec._replace(lowered=_InProgram(
                _primitive_for(problem), self.vmap_in_program, self.transposition, self.second))))
        for candidate in candidates:
            try:
                program = Program(candidate, *args)
                result = program(*args)
            except AssertionError:
                raise  # a check failed
            except Exception:  # noqa: BLE001 - not traceable, or the rule raised: the next, then eagerly
                continue
            self.program = program if candidate is not body else None
            return result
        try:
            return body(*self.inputs, partner)  # eagerly, the Python numbers as given (`rules.rrule` dispatches on them)
        except Exception as err:  # from JAX's own derivative of a JAX function: it rejected the custom rule
            if isinstance(err, AssertionError) or not self.via_jax:
                raise  # a check failed, or the rule's own error from the user's code
            _fail(self.tester, self.name, f"JAX's own jax.{'vjp' if self.kind == 'rrule' else 'jvp'} of f raised an error",
                  got=f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}", cause=err,
                  fix="a custom rule returns one tangent per primal input, each of its primal's shape and dtype "
                  "(a custom_vjp's bwd: a tuple of cotangents; a custom_jvp's rule: (y, y_dot))")

    def fail(self, what: str, **sections: Any) -> NoReturn:
        _fail(self.tester, self.name, what, **sections)

    def check_primal(self) -> None:
        try:
            test_approx(self.ev.y, self.ev.y_expected, rtol=self.rtol, atol=self.atol)
        except AssertionError as err:
            self.fail(f"the {self.kind}'s primal output differs from f(*args)\n{err}")
        self.checks.append("primal")

    def check_inplaceable_thunks(self) -> None:
        for i, path, added, plain in self.ev.inplace:
            _check_close(self.tester, self.name, "InplaceableThunk: add_fn(acc) differs from acc + val",
                         added, plain, 1e-10, 1e-12, _arg(i, path))

    def _central_or_sided(self, got: Any, estimate: Callable[[FDMethod], Any]) -> tuple[Any, float]:
        """(`estimate(fdm)`, atol); where `got` differs, each entry the nearest of it and the one-sided
        estimates (a C1 joint), then where still needed at shorter spans (`_two_in_a_row`); the
        atol is the default's, cut where `got` passes by it alone (`_resolved_atol`)."""
        expected, m, close = estimate(self.fdm), self.fdm, lambda atol: not compare_trees(
            got, expected, self.rtol, atol, True, True)[1]
        if not close(self.atol):
            expected, sided = _nearest_sided(got, expected, [*map(estimate, _sided(self.fdm))], self.rtol, self.atol)
            if sided:
                self.checks.append(f"one-sided finite differences at {sided} entries (f has a kink or changes fast there)")
            if not close(self.atol):  # f changes fast here (README)
                spans = map(estimate, _shorter_spans(self.fdm, np.asarray(_vector(self.problem.args))))
                expected, shorter = _two_in_a_row(got, expected, spans, self.rtol, self.atol)
                if shorter:
                    self.checks.append(f"finite differences at shorter spans at {shorter} entries")
        if self.atol_given or m.kind != "central" or close(1e-300) or not close(self.atol):
            return expected, self.atol
        return expected, _resolved_atol(got, expected, estimate(dataclasses.replace(m, p=m.p + 2)), self.rtol, self.atol)

    def fd_what(self, what: str, atol: float) -> str:
        return f"{what} does not match finite differences" + ("" if atol == self.atol else " (by less than the default "
                f"atol={self.atol:g}, but more than their estimated error: pass atol= to accept that)")

    def _traced_like_eager(self) -> None:
        """After a failed check of the rule's compiled program: fail saying so if the rule gives
        other values eagerly (a code path taken only when traced)."""
        if not self.check_jit:
            return
        rtol, atol = _lowered_tol(self.problem.args, self.ev.y)
        for (argument, traced), (_, eager) in zip(self.derivatives(self.ev),
                                                  self.derivatives(self.body(self.spec, *self.inputs))):
            _check_close(self.tester, self.name, f"{self.derivative} differs under jax.jit from its eager value (the "
                         "rule takes another path when traced; only one of the two can match finite differences)",
                         traced, eager, rtol, atol, argument)

    def check_variants(self, problem: _Problem, what: str, other: Any, want: list, done: Any = None) -> list[str]:
        """The lowered primitive's `jax.{what}` at `(problem.args, other)` under `jax.jit`
        (eagerly with `check_jit=False`), then under `jax.vmap`; it must give `want`, the
        rule's derivative (a cotangent per argument, or the tangent).

        With vmap, a batch of two points must equal the primitive looped over them; element
        0, the point itself, is compared with the rule (alone only if that fails, to say
        whether jit or vmap is wrong); the second point is the first moved slightly, less
        where f is not finite there. `done`: from the rule's program, the result without
        vmap, else `(second, batched)` as a function of the scale (`_vmap_points`)."""
        label = f"jax.jit(jax.{what})" if self.check_jit else f"jax.{what}"
        rtol, atol = _lowered_tol(problem.args, self.ev.y)
        where = [_arg(i) for i in problem.index] if what == "vjp" else ["the output"]
        rule = "the pullback" if what == "vjp" else "the frule"

        def against_rule(result):
            for argument, g, w in zip(where, result[1] if what == "vjp" else [result[1]], want):
                _check_close(self.tester, self.name, f"the lowered primitive's {label} differs from {rule}",
                             g, w, rtol, atol, argument)

        run = _variants_runner(_VariantsSpec(what, _primitive_for(problem), tuple(problem.index), self.check_jit))
        full, fkwargs, args = problem.primals, problem.fkwargs, problem.args
        if not self.check_vmap:
            against_rule(done if done is not None else run(full, fkwargs, args, other))
            return [label]
        want_finite = None
        at = done or (lambda scale: run(full, fkwargs, args, other, tuple(_partner(problem, self.seed, scale).values())))
        for scale in _VMAP_STEPS:
            second, batched = at(scale)
            if want_finite is None:
                first = _element(batched, 0)  # at (args, other)
                try:
                    against_rule(first)
                except AssertionError:  # under jit alone, or only batched? Evaluate it alone to say which
                    alone = run(full, fkwargs, args, other)
                    against_rule(alone)
                    _check_close(self.tester, self.name, "jax.vmap: batched differs from looped (batch element 0)",
                                 first, alone, rtol, atol)
                    raise
                want_finite = _finite_pattern(first)
            got = _finite_pattern(second)  # the second point must stay where f is defined
            if len(got) == len(want_finite) and all(np.array_equal(a, b) for a, b in zip(got, want_finite)):
                break
        _check_close(self.tester, self.name, "jax.vmap: batched differs from looped (batch element 1)",
                     _element(batched, 1), second, rtol, atol)
        return [label, "jax.vmap"]


class _RruleTest(_Test):
    """One `test_rrule` call, over its `_RruleResult`."""

    tester, kind, table, body = "test_rrule", "rrule", rrule, staticmethod(_rrule_body)
    derivative = "the pullback's cotangent"

    @staticmethod
    def derivatives(ev: _RruleResult) -> list:
        return [(_arg(i), value) for i, value in ev.dense.items()]

    def _prepare(self, given, f_dot, primals, tangents, fkwargs, *, output_tangent, check_thunked, mode):
        problem = self.problem
        self.check_thunked = check_thunked
        self.reverse_only = problem.plain and self.calls_custom_vjp
        self.with_frule = _has(frule, self.f, primals)
        # a JAX function (jax.custom_vjp, custom_jvp, plain) has JAX's own jax.vjp checked
        self.spec = _RruleSpec(self.name, self.f, _jax_rrule if self.via_jax else given, self.seed,
                               tuple(problem.index), check_thunked)
        if output_tangent is None:
            output_tangent = _output_seed(self.trace, self.seed)
        self.inputs = (primals, fkwargs, output_tangent, dict(zip(problem.index, problem.tangents)))
        self.mode = ("exact" if problem.size() <= EXACT_MODE_LIMIT else "fast") if mode == "auto" else mode
        if self.mode not in ("exact", "fast"):
            raise ValueError(f"`test_rrule`: mode must be 'auto', 'exact' or 'fast'; got {mode!r}.")
        # the modes JAX gets from the primitive; "" until forward mode is known (`check_lowered`)
        self.modes = "fwd+rev" if self.with_frule else ("rev" if self.reverse_only else "")
        self.lowers, self.transposition = not _unlowered(self.f, problem), not self.modes

    def check_primal(self) -> None:
        super().check_primal()
        self.checks += ["arity", "dtypes"]  # checked in `_rrule_body`
        if self.ev.broken or self.ev.masks:
            self.checks.append("not implemented (not checked): "
                               + ", ".join(_arg(i) for i in self.ev.broken + list(self.ev.masks)))

    def check_finite_differences(self) -> None:
        """The cotangents against finite differences of f in float64 (`mode`)."""
        ev, problem = self.ev, self.problem
        # fast mode probes whole arguments: one partly not implemented is left out
        checked = problem.without(set(ev.broken) | (set(ev.masks) if self.mode == "fast" else set()))
        if not checked.index:
            return
        args64, y_bar64 = _upcast(checked.args), _upcast(ev.y_bar_dense)
        # the rule's cotangents as finite differences can check them (held entries zero)
        got = {i: _held_zero(ev.dense[i], problem.primal(i)) for i in checked.index}
        try:
            if self.mode == "exact":
                self._exact(checked, args64, y_bar64, got)
            else:
                self.worst = _fast_check(self.tester, self.name, checked, self.fdm, args64, y_bar64, got,
                                         self.rtol, self.atol, self.atol_given)
        except AssertionError:
            self._traced_like_eager()
            raise
        self.checks.append(f"finite differences ({self.mode})")

    def _exact(self, checked: _Problem, args64: tuple, y_bar64: Any, got: dict) -> None:
        """J^T y_bar entry by entry, one-sided estimates too where the central one differs."""
        expected, atol = self._central_or_sided(tuple(got[i] for i in checked.index),
                                                lambda m: fd_vjp(m, checked.raw_fn, y_bar64, args64))
        rtol = self.rtol
        for i, exp in zip(checked.index, expected):
            g, x, mask = got[i], self.problem.primal(i), self.ev.masks.get(i)
            if mask:
                g, exp = mask_leaves(g, mask, x), mask_leaves(exp, mask, x)
            self.worst = max(self.worst, _check_close(self.tester, self.name, self.fd_what("cotangent", atol),
                                                      g, exp, rtol, atol, _arg(i), entrywise=True))

    def check_thunked_seed(self) -> None:
        if not self.check_thunked:
            return
        for i, again in self.ev.again.items():
            x, mask = self.problem.primal(i), self.ev.masks.get(i, [])
            _check_close(self.tester, self.name, "a thunked seed gives a different cotangent",
                         mask_leaves(again, mask, x), mask_leaves(self.ev.dense[i], mask, x), 1e-12, 1e-14, _arg(i))
        self.checks.append("thunked seed")

    def check_lowered(self) -> None:
        """The lowered primitive: jax.vjp under jit and vmap, and forward mode where JAX has it."""
        ev, problem = self.ev, self.problem
        if self.reverse_only:
            self.checks.append("forward mode not checked: f calls a jax.custom_vjp, which JAX has no forward mode for")
        lowered = problem.without(set(ev.broken) | set(ev.masks))  # JAX would raise on a NotImplementedTangent
        done = ev.lowered  # evaluated in the rule's program, for these slots
        variants, by_transposition = (done[1], done[2]) if done and done[0] == tuple(lowered.index) else (None, None)
        if variants is not None and self.check_vmap:
            variants = _vmap_points(self, variants, lambda there: (there.y, tuple(
                _doubled(there.dense[i]) for i in lowered.index))) if self.vmap_in_program else None
        if unlowered := _unlowered(self.f, problem):
            self.checks.append(unlowered)
            return
        if not lowered.index:
            return
        self.checks += _lowered(self.tester, self.name, lambda: self.check_variants(
            lowered, "vjp", ev.y_bar_dense, [ev.dense[i] for i in lowered.index], variants))
        if not self.modes:
            forward = _lowered(self.tester, self.name, lambda: _check_forward_by_transposition(
                self.tester, self.name, lowered, ev.y_bar_dense, ev.y, ev.dense, self.check_jit, by_transposition))
            self.checks += forward
            self.modes = "fwd+rev" if forward else "rev"

    def run(self) -> RuleReport:
        """The checks, in order, and their report."""
        self.check_primal()
        self.check_inplaceable_thunks()
        self.check_finite_differences()
        self.check_thunked_seed()
        self.check_lowered()
        return RuleReport(self.name, "jax.vjp" if self.via_jax else "rrule", self.mode, self.worst, tuple(self.checks),
                          time.perf_counter() - self.start, self.modes or "rev")


def _start(tester: str, table: Any, f: Any, args: tuple, seed: int, given: Any) -> tuple:
    """A tester's arguments unpacked: `(f, f_dot, primals, tangents, via_jax)`. f_dot is
    `with_tangent(f, f_dot)`'s, else random (`NoTangent()` without differentiable fields): as
    in ChainRulesTestUtils, a callable struct is perturbed like an argument and its `f_bar`
    checked. via_jax: f has no rule of this kind and none is given, so JAX's own derivative
    is checked (a primitive of ours without the rule fails, saying how to register one)."""
    f, f_dot = (f.primal, f.tangent) if isinstance(f, WithTangent) else (f, rand_tangent(f, seed=seed + 5))
    _tested.set(f)
    primals, tangents = _unpack(args, seed)
    via_jax = given is None and not _has(table, f, primals)
    if via_jax and isinstance(f, Primitive):
        name, kind = function_name(f), table.kind
        _fail(tester, name, f"no {kind} applies",
              got="arguments of types (" + ", ".join(type(x).__name__ for x in primals) + ")",
              fix=f"register one with `@rules.{kind}.register({name})` (or `@{name}.{kind}`)")
    _via_jax.set(via_jax)
    return f, f_dot, primals, tangents, via_jax


def _lowered(tester: str, name: str, check: Callable[[], list[str]]) -> list[str]:
    """Run a check of the lowered primitive; an exception from JAX becomes a test failure."""
    try:
        return check()
    except AssertionError:
        raise
    except Exception as err:  # noqa: BLE001 - any JAX error here means the rule is not traceable
        _fail(tester, name, "the lowered primitive failed under a JAX transformation (jax.vjp/jvp, jit or vmap)",
              got=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
              fix="the rule must be traceable JAX code: use jax.numpy, not NumPy, on its inputs and "
              "intermediates, and no Python control flow on traced values")


def _fast_check(tester, name, problem, m, args64, y_bar64, dense, rtol, atol, given) -> float:
    """`<y_bar, J x_dot>` (finite differences) against `<x_bar, x_dot>` (the rule), per argument,
    along `x_dot = x_bar / |x_bar|^2 + r / (|x_bar| |r|)` (x_bar the rule's cotangent, r
    random: why, rules/testing/README.md); only when that fails are the two parts probed
    apart, to say which one the rule gets wrong."""
    def combination(trees, coefficients):
        return jax.tree_util.tree_map(lambda *vs: sum(np.asarray(v) * c for v, c in zip(vs, coefficients))
                                      if is_differentiable_leaf(vs[0]) else vs[0], *trees)

    probes = functools.partial(_probes, tester, problem, m, args64, y_bar64, rtol, atol, given)

    parts = []  # per argument: (k, i, own, [(label, trees, coefficients)]), the direction checked first
    for k, i in enumerate(problem.index):
        own, rnd = _upcast(dense[i]), _upcast(problem.tangents[k])
        own_norm, rnd_norm = _tree_norm(own), max(_tree_norm(rnd), 1e-300)
        labelled: list[tuple[str, tuple, tuple]] = [("a random direction", (rnd,), (1 / rnd_norm,))]
        if own_norm > 0:  # the two parts apart follow the combination, probed only if it fails
            labelled = [("the rule's own cotangent plus a random direction", (own, rnd),
                         (1 / own_norm**2, 1 / (own_norm * rnd_norm))),
                        ("the rule's own cotangent", (own,), (1 / own_norm,)), *labelled]
        parts.append((k, i, own, labelled))
    worst = 0.0
    checked = probes([(k, own, combination(*labelled[0][1:])) for k, _, own, labelled in parts])
    for (k, i, own, labelled), (lhs, rhs, err, failed) in zip(parts, checked):
        worst = max(worst, err)
        if not failed:
            continue
        label = labelled[0][0]  # which part fails? The first that does on its own, else the combination
        for (part, *_), apart in zip(labelled[1:], probes([(k, own, combination(*l[1:])) for l in labelled[1:]])):
            if apart[3]:
                label, (lhs, rhs, err, _) = part, apart
                break
        _fail(tester, name, f"cotangent does not match finite differences along {label}",
              argument=_arg(i),
              expected=f"<y_bar, J x_dot> = {lhs:.12g} (finite differences)",
              got=f"<x_bar, x_dot> = {rhs:.12g} from the rule (relative error {err:.3g}; rtol={rtol:g})")
    return worst


def _probes(tester, problem, m, args64, y_bar64, rtol, atol, given, items) -> list[tuple[float, float, float, bool]]:
    """`(lhs, rhs, relative error, failed)` per `(k, own, x_dot)` of `items` (`_fast_check`),
    lhs by finite differences along x_dot / |x_dot| (a span is then how far x moves); one
    trace of f for all, one more per shorter span for those that fail, matched where the
    rule agrees with two spans in a row (f changes fast on the scale of the step: README)."""
    zeros = [jax.tree_util.tree_map(jnp.zeros_like, a) for a in args64]
    norms = [max(_tree_norm(d), 1e-300) for _, _, d in items]
    units = [tuple(jax.tree_util.tree_map(lambda v, n=n: v / n if is_differentiable_leaf(v) else v, d) if j == k else z
                   for j, z in enumerate(zeros)) for (k, _, d), n in zip(items, norms)]

    def judged(method: FDMethod, todo: Any) -> dict:
        out = {}
        for j, lhs in zip(todo, _fd_inner_jvps(tester, method, problem.raw_fn, args64, [units[j] for j in todo], y_bar64)):
            (rhs, scale), lhs = _real_inner(*items[j][1:]), lhs * norms[j]
            scale = max(scale, abs(lhs), 1e-300)
            out[j] = (lhs, rhs, abs(lhs - rhs) / scale, abs(lhs - rhs) > atol + rtol * scale)
        return out

    out, before = judged(m, range(len(items))), dict[int, tuple]()
    for method in _shorter_spans(m, np.asarray(_vector(args64))):
        if not (todo := [j for j in out if out[j][3]]):
            break
        now = judged(method, todo)
        out.update({j: before[j] for j in todo if not now[j][3] and j in before and not before[j][3]})
        before = now
    if m.kind == "central" and not given and (todo := [j for j in out if out[j][3]]):
        # as `_resolved_atol`: the default atol (per entry of x_bar) where the differences cannot resolve less
        finer = judged(dataclasses.replace(m, p=m.p + 2), todo)
        for j in todo:
            (lhs, rhs, err, _), d = out[j], items[j][2]
            scale = max(_real_inner(*items[j][1:])[1], abs(lhs), 1e-300)
            l1 = sum(float(np.sum(np.abs(v))) for v in jax.tree_util.tree_leaves(d) if is_differentiable_leaf(v))
            slack = min(atol * l1, 100 * abs(lhs - finer[j][0]) + rtol / 100 * scale)
            out[j] = (lhs, rhs, err, abs(lhs - rhs) > slack + rtol * scale)
    return [out[j] for j in range(len(items))]


def _nearest_sided(got: Any, central: Any, sided: list, rtol: float, atol: float) -> tuple[Any, int]:
    """Each entry of the central estimate that `got` misses (entrywise, as the check compares)
    replaced by the nearest to `got` of it and the one-sided estimates `sided` (f may not be
    smooth here: README); and how many were."""
    count = [0]

    def nearest(g, c, *others):
        if not is_differentiable_leaf(c):
            return c
        g, c = np.asarray(g, np.complex128), np.asarray(c)
        size = max((float(np.max(np.where(np.isfinite(v), np.abs(v), 0), initial=0.0)) for v in (g, c)))
        with np.errstate(invalid="ignore"):
            best, missed = c, ~(np.abs(g - c) <= max(atol, rtol * size))
            for o in others:
                best = np.where(missed & (np.abs(g - np.asarray(o)) < np.abs(g - best)), o, best)
        count[0] += int(np.sum(best != c))
        return best

    try:
        out = jax.tree_util.tree_map(nearest, got, central, *sided)
    except (ValueError, TypeError):  # structures differ (non-numeric leaves): the central estimate
        return central, 0
    return out, count[0]


def _two_in_a_row(got: Any, expected: Any, spans: Any, rtol: float, atol: float) -> tuple[Any, int]:
    """Each entry of `expected` that `got` misses (rtol of its leaf's largest entry) replaced by
    the first of `spans` matching it where the next one does too (made lazily); how many were."""
    (leaves, treedef), got_leaves = jax.tree_util.tree_flatten(expected), jax.tree_util.tree_leaves(got)
    diff = [is_differentiable_leaf(e) for e in leaves]
    if jax.tree_util.tree_structure(got) != treedef or not any(diff):
        return expected, 0
    flat = lambda t: np.concatenate([np.ravel(np.asarray(v, np.complex128)) for v, d in zip(t, diff) if d])
    g, out = flat(got_leaves), flat(leaves)
    tol = np.concatenate([np.full(np.size(v), max(atol, rtol * float(np.max(np.abs(np.asarray(v)), initial=0))))
                          for v, d in zip(got_leaves, diff) if d])
    todo = ~(np.abs(g - out) <= tol)
    before, left, spans = None, int(todo.sum()), iter(spans)
    while todo.any() and (est := next(spans, None)) is not None:
        est = flat(jax.tree_util.tree_leaves(est))
        now = np.abs(g - est) <= tol
        if before is not None:
            take = todo & before[1] & now
            out[take], todo = before[0][take], todo & ~take
        before = (est, now)
    parts = iter(np.split(out, np.cumsum([np.size(e) for e, d in zip(leaves, diff) if d])[:-1]))
    rebuilt = [(lambda v: v if np.iscomplexobj(e) else v.real)(next(parts).reshape(np.shape(e))) if d else e
               for e, d in zip(leaves, diff)]
    return jax.tree_util.tree_unflatten(treedef, rebuilt), left - int(todo.sum())


def _resolved_atol(got: Any, expected: Any, finer: Any, rtol: float, atol: float) -> float:
    """The default atol covers finite differences' error where they cannot resolve a small derivative;
    where `got` passes by it alone it is cut to 100 times that error, as a method of two more points
    (`finer`) estimates it there, plus rtol / 100 of the largest entry (the rule's own rounding)."""
    leaves = [tuple(np.asarray(v, np.complex128) for v in t) for t in zip(*map(jax.tree_util.tree_leaves,
              (got, expected, finer))) if is_differentiable_leaf(t[1]) and np.shape(t[0]) == np.shape(t[2])]
    big, err = 0.0, 0.0
    with np.errstate(invalid="ignore"):
        for g, e, f in leaves:
            size = max(float(np.max(np.where(np.isfinite(v), np.abs(v), 0), initial=0.0)) for v in (g, e))
            alone = (np.abs(g - e) > rtol * size) & np.isfinite(g - e)
            big, err = max(big, size), max(err, float(np.max(np.where(np.isfinite(f), abs(e - f), np.inf)[alone],
                                                              initial=0.0)))
    return min(atol, 100 * err + rtol / 100 * big) if math.isfinite(err) else atol


def _check_arity(tester, name, cts, nargs) -> tuple:
    if not isinstance(cts, tuple):
        _fail(tester, name, "the pullback must return a tuple (f_bar, x1_bar, ..., xn_bar)",
              expected=f"a tuple of {1 + nargs}", got=type(cts).__name__)
    if len(cts) != 1 + nargs:
        _fail(tester, name, "the pullback returned the wrong number of cotangents",
              expected=f"{1 + nargs} (f_bar first, then one per argument)", got=str(len(cts)),
              fix="return (NoTangent(), x1_bar, ..., xn_bar)")
    return cts


def _check_no_tangent(tester, name, i, ct, why: str = "fixed") -> None:
    """A slot that is not differentiated must get `NoTangent()`: an argument that cannot be
    perturbed (`why="fixed"`), one marked `with_tangent(x, NoTangent())` ("marked"), or the
    function itself when it has no tangent ("function"). A `NotImplementedTangent` passes,
    as ChainRulesTestUtils marks it broken rather than failed."""
    value = unthunk(ct)
    if isinstance(value, (NoTangent, NotImplementedTangent)):
        return
    got = "ZeroTangent()" if isinstance(value, ZeroTangent) else type(value).__name__
    if why == "function":
        _fail(tester, name, "the cotangent of the function itself must be NoTangent() for a function "
              "without a tangent", argument="f_bar (entry 0)", expected="NoTangent()", got=got,
              fix="return NoTangent() first; a callable with differentiable fields is checked when it "
              "has a tangent (`with_tangent(f, f_dot)`, or a random one for a pytree)")
    what = ("an argument that cannot be perturbed" if why == "fixed"
            else "an argument marked with_tangent(x, NoTangent())")
    if isinstance(value, ZeroTangent):
        _fail(tester, name, f"{what} got ZeroTangent()",
              argument=_arg(i), expected="NoTangent()", got="ZeroTangent()",
              fix="return NoTangent(): ZeroTangent says perturbing the input changes nothing, "
              "NoTangent says it cannot be perturbed at all (ints, bools, strings, indices)")
    _fail(tester, name, f"{what} got a cotangent", argument=_arg(i), expected="NoTangent()", got=got,
          fix=None if why == "fixed" else "return NoTangent() for it, or give it a tangent to check its cotangent")


def _inplaceable_sums(tester, name, i, part: InplaceableThunk, path: Any) -> tuple[Any, Any]:
    """`(add_fn(acc), acc + val)` for a random acc, which must agree."""
    try:
        leaf_like = jnp.asarray(unthunk(part.val))
    except Exception:  # noqa: BLE001 - reported below as a failure of the thunk itself
        leaf_like = None
    if leaf_like is None:
        _fail(tester, name, "the InplaceableThunk's val cannot be evaluated",
              argument=_arg(i, jax.tree_util.keystr(path)))
    acc = jnp.asarray(rand_tangent(leaf_like, seed=7))
    return part.add_fn(acc), acc + unthunk(part.val)


def _doubled(tree: Any) -> Any:
    """The differentiable leaves times 2, in NumPy (dtype kept) where they are concrete arrays."""
    def double(a):
        if not is_differentiable_leaf(a):
            return a
        a = _on_host(a)
        return (a * 2).astype(a.dtype, copy=False) if isinstance(a, np.ndarray) else 2 * a

    return jax.tree_util.tree_map(double, tree)


def _vmap_points(test: Any, first: Any, unbatched: Callable) -> Callable[[float], tuple]:
    """`check_variants`' jax.vmap check from a rule's program (`test`): at the second point
    `scale` away, `(unbatched, batched)`, batched over both points with the second's seed
    doubled (`first` at the first scale); unbatched the same program run there, the slots
    the batch moves moved (no not-implemented one), `unbatched(result)` (the derivative
    doubled), or on large inputs (`test.second`) computed by the program. None compiled for it."""
    def at(scale: float) -> tuple:
        partner = _partner(test.problem, test.seed, scale)
        batched = first if scale == _VMAP_STEPS[0] else test.program(*_arguments(test, partner)).lowered[1]
        if test.second:  # the program computed (unbatched, batched) itself
            return batched
        return unbatched(test.program(*_arguments(test, partner, test.ev.lowered[0]))), batched

    return at


def _arguments(test: Any, partner: dict | None, moved: tuple = ()) -> tuple:
    """A tester's rule program's arguments: the perturbed slots as `problem.args` (`_traced_numbers`),
    those in `moved` at the jax.vmap check's second point."""
    (primals, *rest), problem = test.inputs, test.problem
    at = {i: partner[i] if partner and i in moved else x for i, x in zip(problem.index, problem.args) if i >= 0}
    return (tuple(filled(primals, at, at.values())), *rest, partner)


def _call_merged(prim: Any, index: tuple, full: tuple, fkwargs: dict, *dargs: Any) -> Any:
    """`prim(*full, **fkwargs)` with the arguments at `index` replaced by `dargs`."""
    return prim(*filled(full, index, dargs), **fkwargs)


def _lowered_vjp(prim, index, full, fkwargs, dargs, y_bar):
    """`jax.vjp` of the primitive, in ChainRules' convention (conjugated)."""
    out, back = jax.vjp(functools.partial(_call_merged, prim, index, full, fkwargs), *dargs)
    return out, conj_tree(back(_jax_seed(y_bar, out)))


def _lowered_jvp(prim, index, full, fkwargs, dargs, dtangents):
    call = functools.partial(_call_merged, prim, index, full, fkwargs)
    return jax.jvp(call, tuple(dargs), tuple(_jax_tangents(tuple(dtangents), tuple(dargs))))


_LOWERED = {"vjp": _lowered_vjp, "jvp": _lowered_jvp}


class _VariantsSpec(NamedTuple):
    what: str  # "vjp" or "jvp"
    prim: Any
    indices: tuple
    jit: bool  # traced into one program (else run eagerly)


def _batch_axes(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda leaf: 0 if is_differentiable_leaf(leaf) else None, tree)


def _pair(fn: Callable, a0: Any, a1: Any, other: Any) -> Any:
    """`fn` under jax.vmap over a batch of two points: (a0, other) and (a1, 2 other), the seed
    doubled so that the two differ in it even where a1 is a0."""
    return jax.vmap(fn, in_axes=(_batch_axes(a0), _batch_axes(other)))(_stacked(a0, a1), _stacked(other, _doubled(other)))


def _variants_body(spec: _VariantsSpec, full, fkwargs, a0, o0, a1=None):
    """The lowered primitive at (a0, o0); given jax.vmap's second point a1, instead at
    (a1, 2 o0) and batched over both (`_pair`): `_Test.check_variants` takes the batch's element 0
    for the point itself, one evaluation of the rule fewer (a quarter of the vmap check's
    work at 10^6 elements)."""
    fn = functools.partial(_LOWERED[spec.what], spec.prim, spec.indices, full, fkwargs)
    if a1 is None:
        return fn(a0, o0)
    once = jax.jit(fn) if spec.jit else fn  # traced once for both uses (a pjit in the program)
    return once(a1, _doubled(o0)), _pair(once, a0, a1, o0)


def _variants_runner(spec: _VariantsSpec) -> Callable:
    """`_variants_body` for `spec`: one compiled program (`_compiled.run`) with `spec.jit`,
    else eager."""
    body = functools.partial(_variants_body, spec)
    return functools.partial(run_compiled, body) if spec.jit else body


def _apply(f: Any, *args: Any, **kwargs: Any) -> Any:
    return f(*args, **kwargs)


def _jax_rrule(f: Any, *args: Any, **kwargs: Any) -> tuple:
    """JAX's own `jax.vjp` of `f(*args)` as an rrule (ChainRules' conventions), the fields of
    a callable pytree f included (its f_bar), whatever rules are registered."""
    y, pullback = rrule_via_ad(_apply, f, *args, **kwargs)
    return y, lambda y_bar: pullback(y_bar)[1:]


def _jax_frule(tangents: tuple, f: Any, *args: Any, **kwargs: Any) -> tuple:
    """JAX's own `jax.jvp` of `f(*args)` as an frule (`tangents[0]`: f's own tangent)."""
    return frule_via_ad((NoTangent(), *tangents), _apply, f, *args, **kwargs)


def _primitive_for(problem: _Problem) -> Any:
    """What JAX differentiates in the lowered checks: the primitive, one made for a function
    with registered rules, or, for a function checked through JAX's own derivative
    (`problem.plain`), the function itself."""
    f = problem.f
    return f if isinstance(f, Primitive) or problem.plain else Primitive(f)


def _calls_custom_vjp(jaxpr: Any) -> bool:
    """Whether JAX has no forward mode for a jaxpr: it calls a `jax.custom_vjp` (jax.jvp of
    one raises; it is not a fault of the rule). A `jax.custom_jvp`'s body is not looked into:
    its own rule gives its forward mode."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name.startswith("custom_vjp"):
            return True
        if eqn.primitive.name.startswith("custom_jvp"):
            continue
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's jaxpr, or a Jaxpr
                if hasattr(inner, "eqns") and _calls_custom_vjp(inner):
                    return True
    return False


def _check_forward_by_transposition(tester, name, problem, y_bar_dense, y, dense, check_jit=True,
                                    done=None) -> list[str]:
    """Without an frule, forward mode transposes the pullback: `<y_bar, J x_dot> == <J^T y_bar, x_dot>`.

    Returns the check's label, or nothing where JAX cannot transpose the pullback (then the
    primitive has reverse mode only, which is reported, not failed). Compiled with
    `check_jit`, else eagerly. `done`: `("fwd+rev", y_dot)` or `("rev", None)` from the rule's
    program (`_lowered_in_program`).
    """
    if done is not None:
        if done[0] == "rev":
            return []
        y_dot = done[1]
    else:
        run = _variants_runner(_VariantsSpec("jvp", _primitive_for(problem), tuple(problem.index), check_jit))
        try:
            _, y_dot = run(problem.primals, problem.fkwargs, problem.args, problem.tangents)
        except ForwardModeError:
            return []
    lhs, lhs_scale = _real_inner(y_bar_dense, y_dot)
    rhs, rhs_scale = _real_inner(tuple(dense[i] for i in problem.index), problem.tangents)
    rtol, atol = _lowered_tol(problem.args, y)
    if abs(lhs - rhs) > atol + rtol * max(lhs_scale, rhs_scale):
        _fail(tester, name, "forward mode (jax.jvp through the transposed pullback) disagrees with the pullback",
              expected=f"<J^T y_bar, x_dot> = {rhs:.12g} (the pullback)",
              got=f"<y_bar, J x_dot> = {lhs:.12g} (jax.jvp)",
              fix="the pullback must be linear in y_bar: no branches or clipping on its value")
    return ["jax.jvp (transposed pullback)"]


class _FruleSpec(NamedTuple):
    """What `_frule_body` reads besides its arguments: fixed while it is traced."""

    name: str
    f: Any
    frule_f: Any
    seed: int
    indices: tuple
    transposable: bool  # an rrule applies too: check the two are transposes
    lowered: _InProgram | None = None  # the lowered primitive's checks, traced into the same program


class _FruleResult(NamedTuple):
    """What `_frule_body` computed (a pytree: it comes out of the compiled program)."""

    y: Any  # the rule's primal output
    y_expected: Any  # f(*args) itself
    inplace: list  # ("output", path, add_fn(acc), acc + val) per InplaceableThunk
    mask: list  # which output leaves are NotImplemented
    y_dot_dense: Any  # the tangent, dense
    transposed: Any = None  # (y_bar, rrule cotangents) for the transposition check, if an rrule exists
    lowered: tuple | None = None  # the lowered primitive's jax.jvp (`_lowered_in_program`)


def _frule_body(spec: _FruleSpec, ps: tuple, given: tuple, fkwargs: dict, tangents: tuple = (),
                y_bar: Any = None, partner: dict | None = None) -> _FruleResult:
    """The frule and the checks of its conventions (see `_rrule_body`); with `spec.lowered`,
    the lowered primitive's `jax.jvp` at `tangents` (dense, one per perturbed slot) too;
    `y_bar`: the transposition check's seed (random if None)."""
    tester, name, f = "test_frule", spec.name, spec.f
    y, y_dot = _call_rule(tester, name, "frule", lambda: (spec.frule_f or frule)(given, f, *ps, **fkwargs))
    parts = jax.tree_util.tree_flatten_with_path(y_dot, is_leaf=lambda t: isinstance(t, InplaceableThunk))[0]
    inplace = [("output", jax.tree_util.keystr(path), *_inplaceable_sums(tester, name, "output", part, path))
               for path, part in parts if isinstance(part, InplaceableThunk)]
    value = _evaluated(y_dot)
    mask = not_implemented_mask(value, y)  # output leaves the rule does not implement
    value = without_not_implemented(value)
    _check_dtypes(tester, name, value, y, "output")
    out: dict = dict(y=y, y_expected=unwrap(f)(*ps, **fkwargs), inplace=inplace, mask=mask,
                     y_dot_dense=dense_like(value, y, name=name))
    if spec.transposable and spec.indices and not any(mask):
        out["transposed"] = _transposition_cotangents(spec, ps, fkwargs, y, y_bar)
    if spec.lowered is not None and not any(mask):
        out["lowered"] = _lowered_in_program(spec.lowered, "jvp", ps, fkwargs, spec.indices, tangents, {}, partner)
    return _FruleResult(**out)


# ----- test_frule -----------------------------------------------------------------------------
@_full_precision
def test_frule(f: Callable, *args: Any, rtol: float | None = None, atol: float | None = None, fdm: FDMethod | None = None,
               check_jit: bool = True, check_vmap: bool = True, seed: int = 0, frule_f: Callable | None = None,
               **fkwargs: Any) -> RuleReport:
    """Check the frule of `f` at `args` against finite differences and through JAX.

    `f` is a `rules.primitive` (or has a registered frule), or any JAX function with forward
    mode: one with no frule of ours (a `jax.custom_jvp`, plain JAX code) has JAX's own
    `jax.jvp` checked (report kind "jax.jvp"); one calling a `jax.custom_vjp`, which JAX has
    no forward mode for, fails saying so. Checks: a rule applies; its primal is `f(*args)`;
    the tangent has the output's shape and dtype and equals finite differences (entry by
    entry up to 256 input elements); an `InplaceableThunk` tangent's `add_fn(acc)` equals
    `acc + val`; where the primitive is lowered through `jax.custom_jvp` (no rrule), `jax.jvp`
    of it equals the frule under `jax.jit` and `jax.vmap`; where an rrule exists too,
    `<y_bar, frule(x_dot)> == <rrule(y_bar), x_dot>`. Details: rules/testing/README.md.

    Args:
      f: the function; a callable pytree with differentiable fields is perturbed too (its
        tangent is the frule's `f_dot`).
      *args: the point; `with_tangent(x, x_dot)` gives an argument's tangent (default:
        random, from `seed`), `with_tangent(x, NoTangent())` marks it not differentiated.
      rtol, atol, fdm, check_jit, check_vmap: as for `test_rrule`.
      seed: seeds the random tangents.
      frule_f: replaces `rules.frule`, as `frule_f(tangents, f, *args, **fkwargs)`; e.g.
        `rules.frule_via_ad`.
      **fkwargs: keyword arguments of `f`, not differentiated.

    Returns:
      A `RuleReport`.

    Raises:
      AssertionError: a check failed; the message names the rule, expected vs got.

    >>> import rules
    >>> @rules.primitive
    ... def square(x):
    ...     return x * x
    >>> @square.frule
    ... def square_frule(tangents, x):
    ...     return square(x), 2 * x * tangents[1]
    >>> test_frule(square, 3.0).kind
    'frule'

    See also: `test_rrule`, `test_scalar`, `with_tangent`.
    """
    return _FruleTest(f, args, fkwargs, frule_f, rtol=rtol, atol=atol, fdm=fdm, check_jit=check_jit,
                      check_vmap=check_vmap, seed=seed).run()


class _FruleTest(_Test):
    """One `test_frule` call, over its `_FruleResult`."""

    tester, kind, table, body = "test_frule", "frule", frule, staticmethod(_frule_body)
    derivative = "the frule's tangent"

    @staticmethod
    def derivatives(ev: _FruleResult) -> list:
        return [("the output", ev.y_dot_dense)]

    def _prepare(self, given, f_dot, primals, tangents, fkwargs):
        problem = self.problem
        if self.via_jax and self.calls_custom_vjp:
            self.fail("f calls a jax.custom_vjp, and JAX has no forward mode for it (jax.jvp raises)",
                      expected="a function with forward mode: a jax.custom_jvp, plain JAX code, or a primitive with "
                      "an frule", got="a jax.custom_vjp inside f", fix=f"check its reverse mode with `test_rrule({self.name}, ...)`")
        # a JAX function (jax.custom_jvp, plain) has JAX's own jax.jvp checked
        self.spec = _FruleSpec(self.name, self.f, _jax_frule if self.via_jax else given, self.seed,
                               tuple(problem.index), _has(rrule, self.f, primals))
        self.unlowered = _unlowered(self.f, problem)
        # no rrule: jax.jvp of the primitive runs the frule, lowered through jax.custom_jvp (an
        # unhashable f has no primitive); only then are its checks traced into the frule's program
        self.lowers = not self.unlowered and lowered_rules(self.f, primals)[0] is None
        y_bar = _output_seed(self.trace, self.seed) if self.spec.transposable and problem.index else None
        self.inputs = (primals, (f_dot if problem.f_perturbed else NoTangent(), *tangents), fkwargs, problem.tangents,
                       y_bar)

    def check_inplaceable_thunks(self) -> None:
        super().check_inplaceable_thunks()
        self.checks += (["InplaceableThunk add"] if self.ev.inplace else []) + ["dtypes"]
        if any(self.ev.mask):
            self.checks.append("not implemented (not checked): the output" + ("" if all(self.ev.mask) else " in part"))

    def check_finite_differences(self) -> None:
        """J x_dot by finite differences in float64: a step per coordinate up to 256 elements,
        compared entry by entry; along x_dot above."""
        ev, problem = self.ev, self.problem
        args64, tangents64 = _upcast(problem.args), _upcast(problem.tangents)
        exact = problem.size() <= EXACT_MODE_LIMIT
        got = mask_leaves(ev.y_dot_dense, ev.mask, ev.y)
        along = (lambda m: _fd_jvp_by_coordinates(m, problem.raw_fn, args64, tangents64)) if exact else (
            lambda m: _fd_jvps("fd_jvp", m, problem.raw_fn, args64, [tangents64], None)[0])  # one step along x_dot
        expected, atol = self._central_or_sided(got, lambda m: mask_leaves(along(m), ev.mask, ev.y))
        try:
            self.worst = _check_close(self.tester, self.name, self.fd_what("tangent", atol), got,
                                      mask_leaves(expected, ev.mask, ev.y), self.rtol, atol, "the output",
                                      entrywise=exact)
        except AssertionError:
            self._traced_like_eager()
            raise
        self.checks.append("finite differences")

    def check_lowered(self) -> None:
        """jax.jvp of the primitive under jit and vmap, where it runs the frule (custom_jvp)."""
        if self.unlowered:
            self.checks.append(self.unlowered)
        elif not any(self.ev.mask) and self.lowers:
            done = self.ev.lowered[1] if self.ev.lowered else None  # evaluated in the rule's program
            if done is not None and self.check_vmap:
                done = _vmap_points(self, done, lambda there: (there.y, _doubled(there.y_dot_dense))) \
                    if self.vmap_in_program else None
            self.checks += _lowered(self.tester, self.name, lambda: self.check_variants(
                self.problem, "jvp", self.problem.tangents, [self.ev.y_dot_dense], done))

    def check_transposition(self) -> None:
        if self.ev.transposed is not None:
            self.checks += _check_transposition(self.tester, self.name, self.problem, self.ev.transposed,
                                                self.ev.y_dot_dense, self.rtol, self.atol)

    def run(self) -> RuleReport:
        """The checks, in order (the tangent's where anything is perturbed and the frule implements
        it), and their report."""
        self.check_primal()
        self.check_inplaceable_thunks()
        if self.problem.index and not (self.ev.mask and all(self.ev.mask)):
            self.check_finite_differences()
            self.check_lowered()
            self.check_transposition()
        # an frule serves forward mode; JAX transposes it or uses an rrule in reverse
        mode = "exact" if self.problem.size() <= EXACT_MODE_LIMIT else "fast"  # above: along x_dot only
        return RuleReport(self.name, "jax.jvp" if self.via_jax else "frule", mode, self.worst, tuple(self.checks),
                          time.perf_counter() - self.start, "fwd+rev")


def _transposition_cotangents(spec: _FruleSpec, ps: tuple, fkwargs: dict, y: Any, y_bar: Any) -> Any:
    """`(y_bar, rrule(y_bar))` densely for the transposition check (`y_bar` random if None), or
    `()` where the rrule does not implement a cotangent (nothing to compare)."""
    y_bar = rand_tangent(y, seed=spec.seed + 1) if y_bar is None else y_bar
    _, pullback = _call_rule("test_frule", spec.name, "rrule", lambda: rrule(spec.f, *ps, **fkwargs))
    cts = _check_arity("test_frule", spec.name, pullback(y_bar), len(ps))
    x_bars = []
    for i in spec.indices:
        value = _evaluated(cts[1 + i])
        if any(not_implemented_mask(value, _slot(spec.f, ps, i))):
            return ()
        x_bars.append(dense_like(value, _slot(spec.f, ps, i)))
    return dense_like(y_bar, y), tuple(x_bars)


def _check_transposition(tester, name, problem, transposed, y_dot_dense, rtol, atol) -> list[str]:
    """`<y_bar, frule(x_dot)> == <rrule(y_bar), x_dot>`, ChainRules' convention for the two rules."""
    if not transposed:
        return []
    y_bar_dense, x_bars = transposed
    lhs, s1 = _real_inner(y_bar_dense, y_dot_dense)
    rhs, s2 = _real_inner(x_bars, problem.tangents)  # summed over the arguments' leaves
    if abs(lhs - rhs) > atol + rtol * max(s1, s2):
        _fail(tester, name, "the frule and the rrule are not transposes of each other",
              expected=f"<y_bar, frule(x_dot)> = {lhs:.12g}",
              got=f"<rrule(y_bar), x_dot> = {rhs:.12g}",
              fix="one of the two rules is wrong (check conj() in the rrule of complex functions)")
    return ["frule/rrule transposition"]


# ----- test_scalar ----------------------------------------------------------------------------
_PARTIALS = (("Re y", "Re z"), ("Re y", "Im z"), ("Im y", "Re z"), ("Im y", "Im z"))


def test_scalar(f: Callable, z: Any, *, rtol: float | None = None, atol: float | None = None,
                fdm: FDMethod | None = None, **kwargs: Any) -> list[RuleReport]:
    """Check the rules of a scalar function `f` at `z`, real or complex.

    Runs `test_frule` and `test_rrule`, whichever rules exist (for a JAX function with no
    rule of ours, JAX's own derivatives, forward mode where JAX has it). For complex `z` both
    directions (1 and 1j) are probed and the four real partials of (Re y, Im y) / (Re z, Im z)
    compared with finite differences, in ChainRules' convention (rules/testing/README.md),
    each to within `rtol` of the largest (a zero partial beside large ones: not to `atol`).

    Args:
      f: the function, of one scalar.
      z: the point, a real or complex scalar.
      rtol, atol, fdm: as for `test_rrule`.
      **kwargs: the testers' other options (`check_jit`, `seed`, ...); any other keyword
        is passed to `f` and its rules.

    Returns:
      The testers' `RuleReport`s, in the order they ran.

    Raises:
      AssertionError: a check failed; the message names the rule, expected vs got.

    >>> import jax.numpy as jnp, rules
    >>> @rules.primitive
    ... def csquare(z):
    ...     return z * z
    >>> _ = rules.scalar_rule(csquare, lambda z, y: 2 * z)
    >>> [r.kind for r in test_scalar(csquare, 1.0 + 2.0j)]
    ['frule', 'rrule', 'frule', 'rrule']

    See also: `test_frule`, `test_rrule`.
    """
    from ._compare import with_tangent

    name = function_name(f)
    fkwargs = {k: v for k, v in kwargs.items() if k not in _TESTER_OPTIONS}
    has_fr, has_rr = _has(frule, f, (z,)), _has(rrule, f, (z,))
    via_jax = not (has_fr or has_rr)
    if via_jax and isinstance(f, Primitive):
        _fail("test_scalar", name, "no rule applies", got=f"an argument of type {type(z).__name__}",
              fix=f"define one, e.g. `rules.scalar_rule({name}, partials)`")
    if via_jax:  # a JAX function: JAX's own derivatives, forward mode where JAX has it
        has_rr = True
        has_fr = not _calls_custom_vjp(jax.make_jaxpr(lambda v: f(v, **fkwargs))(z).jaxpr)
    opts = dict(rtol=rtol, atol=atol, fdm=fdm, **kwargs)
    y = unwrap(f)(z, **fkwargs)
    if jnp.iscomplexobj(z):  # first: a wrong rule is then reported by the partial it gets wrong
        rules_of = (_jax_frule, _jax_rrule) if via_jax else (frule, rrule)
        _check_partials(f, z, has_fr, has_rr, rtol, atol, fdm, fkwargs, rules_of)
    reports: list[RuleReport] = []
    directions = (1.0, 1.0j) if jnp.iscomplexobj(z) else (1.0,)
    seeds = (1.0, 1.0j) if jnp.iscomplexobj(y) else (1.0,)
    for k in range(max(len(directions), len(seeds))):
        if has_fr and k < len(directions):
            reports.append(test_frule(f, with_tangent(z, jnp.asarray(directions[k], jnp.result_type(z))), **opts))
        if has_rr and k < len(seeds):
            reports.append(test_rrule(f, z, output_tangent=jnp.asarray(seeds[k], jnp.result_type(y)), **opts))
    return reports


def _as_complex(t: Any) -> complex | None:
    """A scalar tangent as a complex number: 0 for a zero, None where not implemented."""
    t = unthunk(t)
    if isinstance(t, AbstractZero):
        return 0j
    if isinstance(t, NotImplementedTangent):
        return None
    return complex(np.asarray(t))


def _check_partials(f, z, has_fr, has_rr, rtol, atol, fdm, fkwargs=None, rules_of=None) -> None:
    """The four real partials of a complex scalar function from its frule and rrule
    (`rules_of`: the two to call, the registry's by default) against finite differences."""
    frule_of, rrule_of = rules_of or (frule, rrule)
    name = function_name(f)
    fkwargs = fkwargs or {}
    raw = unwrap(f)
    y = raw(z, **fkwargs)
    complex_out = jnp.iscomplexobj(y)
    rtol, atol = tolerances(rtol, atol, z, y)
    got: dict[tuple[str, str], float] = {}
    dtype = jnp.result_type(z)
    f_dot = _zero_like(f)  # the partials with respect to z only
    if has_fr:
        for col, d in (("Re z", 1.0), ("Im z", 1.0j)):
            _, y_dot = frule_of((f_dot, jnp.asarray(d, dtype)), f, z, **fkwargs)
            if col == "Re z":  # a real tangent must give what 1 + 0i gives (ChainRulesTestUtils)
                _, real_dot = frule_of((f_dot, jnp.asarray(1.0, jnp.finfo(dtype).dtype)), f, z, **fkwargs)
                _check_embedding(name, "frule", "tangent", real_dot, y_dot, rtol, atol)
            value = _as_complex(y_dot)
            if value is None:
                continue
            got[("Re y", col)] = value.real
            if complex_out:
                got[("Im y", col)] = value.imag
    if has_rr:
        rows = (("Re y", 1.0), ("Im y", 1.0j)) if complex_out else (("Re y", 1.0),)
        for row, d in rows:
            _, pullback = rrule_of(f, z, **fkwargs)
            x_bar = pullback(jnp.asarray(d, jnp.result_type(y)) if complex_out else d)[1]
            if complex_out and row == "Re y":  # a real cotangent must give what 1 + 0i gives
                real_bar = rrule_of(f, z, **fkwargs)[1](jnp.asarray(1.0, jnp.finfo(jnp.result_type(y)).dtype))[1]
                _check_embedding(name, "rrule", "cotangent", real_bar, x_bar, rtol, atol)
            x_bar = _as_complex(x_bar)
            if x_bar is None:
                continue
            for col, value in (("Re z", x_bar.real), ("Im z", x_bar.imag)):
                if (row, col) in got and abs(got[(row, col)] - value) > atol + rtol * abs(value):
                    _fail("test_scalar", name, f"frule and rrule disagree on d({row})/d({col})",
                          expected=f"{got[(row, col)]:.12g} (frule)", got=f"{value:.12g} (rrule)")
                got[(row, col)] = value
    fd = _fd_partials(fdm or _DEFAULT_FDM, lambda v: raw(v, **fkwargs), z, got, rtol, atol)
    largest = max(map(abs, fd.values()))  # a partial's error shows relative to the largest (0 next to 5000)
    for key, value in got.items():
        if abs(value - fd[key]) > atol + rtol * max(abs(fd[key]), abs(value), largest):
            _fail("test_scalar", name, f"the partial d({key[0]})/d({key[1]}) does not match finite differences",
                  expected=f"{fd[key]:.12g} (finite differences)", got=f"{value:.12g} (rule)")


def _fd_partials(fdm: FDMethod, g: Callable, z: Any, got: dict, rtol: float, atol: float) -> dict:
    """The real partials of g at z by finite differences (its real Jacobian); where the rule's
    `got` differs, at shorter spans, matched two in a row (`_two_in_a_row`)."""
    z64 = _upcast(jnp.asarray(z))
    partials = lambda m: np.ravel(fd_jacobian(m, g, z64)[0])  # in _PARTIALS' order
    fd = dict(zip(_PARTIALS, partials(fdm).tolist()))
    rule, estimate = np.array([got.get(key, value) for key, value in fd.items()]), np.array(list(fd.values()))
    if compare_trees(rule, estimate, rtol, atol, True, True)[1]:  # f changes fast on the step's scale (README)
        spans = map(partials, _shorter_spans(fdm, np.asarray(_vector(z64))))
        fd = dict(zip(fd, _two_in_a_row(rule, estimate, spans, rtol, atol)[0].tolist()))
    return fd


def _check_embedding(name, kind, what, real, embedded, rtol, atol) -> None:
    try:
        test_approx(real, embedded, rtol=rtol, atol=atol)
    except AssertionError as err:
        _fail("test_scalar", name, f"the {kind} gives a different {what} for a real 1.0 than for 1.0 + 0.0j",
              expected=f"the {what} for 1.0 + 0.0j", got=str(err).splitlines()[0],
              fix="treat a real tangent of a complex argument as the complex number it embeds")


for _tester in (test_rrule, test_frule, test_scalar):
    setattr(_tester, "__test__", False)  # named test_*, but not tests: pytest must not collect them
