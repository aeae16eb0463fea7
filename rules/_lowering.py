"""The adapter: a primitive's rules lowered into JAX (`_dual`, `jax.custom_vjp`, `jax.custom_jvp`).

A primitive with an rrule is, where JAX has the internals `_dual` uses, one JAX primitive
that keeps its rules (`_dual.call`, mode DUAL); `_Lowered` below holds the rules of one
argument signature and runs them, and `_dual` routes JAX's requests to them. Elsewhere (and
for an frule alone) the rules become a `jax.custom_vjp` or `jax.custom_jvp`, the mode chosen
when the primitive is called.

Every conversion between ChainRules' conventions and JAX's (zeros, thunks, `Tangent`s,
projection, the complex switch) is in `rules/_boundary.py`; this module runs the rules.

An argument leaf is *differentiable* (an inexact array or a Python float/complex),
*non-differentiable but dynamic* (an int/bool array, or any array given as a keyword), or
*static* (anything else: part of the cache key, closed over by the lowered function).

A pullback is a Python closure over the forward pass's values. When those values are
concrete (eager `jax.grad`), the closure itself is the residual. Under a trace, the backward
pass may run in another trace. With one differentiable output the pullback is traced in the
forward pass into a jaxpr whose constants become the residuals. With more, the zero pattern
of the output cotangent is known only in the backward pass: the residuals are the inputs,
and the backward pass calls the pullback once, with the pattern JAX hands over, as
`jax.custom_vjp` calls bwd: through the closure where JAX hands back the forward pass's own
tracers (their trace is still open: `jax.jit(jax.grad(f))`), else after running the rrule
again from the inputs (a `lax.scan`'s backward loop). A trace that raises raises only if its
backward pass runs.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from ._boundary import (
    DIFF,
    STATIC,
    filled,
    frule_tangents,
    is_jax_zero,
    leaf_kind,
    pullback_seed,
    rebuilt,
    to_jax_cotangents,
    to_jax_tangent,
    zero_tangent_of,
)
from ._jax_compat import VALUE_DEPENDENT, concrete_value
from ._errors import (
    ForwardModeError,
    RuleDefinitionError,
    RuleError,
    StaticArgumentError,
    describe_argument,
    format_message,
    parameter_name,
)
from ._errors import naming as _naming
from ._projection import ArrayTypes
from ._registry import check_frule_result, check_rrule_result, frule, function_name, note_traced, rrule
from . import _dual

__all__ = ["call_lowered", "is_tracer", "bypass_in_own_rule"]

VJP, JVP, JVP_BY_TRANSPOSE, DUAL = "vjp", "jvp", "jvp by transposing the pullback", "dual"
_Tracer = jax.core.Tracer
_CACHE_SIZE = 512


# Primitives whose rule is running now. Under an outer forward mode (e.g. `jax.hessian`),
# `f(x)` inside f's own rule is the plain function: the custom_vjp has no forward mode.
_active_rules: contextvars.ContextVar[frozenset] = contextvars.ContextVar("rules_active", default=frozenset())


@contextlib.contextmanager
def _running_rule_of(key: Any):
    token = _active_rules.set(_active_rules.get() | {key})
    try:
        yield
    finally:
        _active_rules.reset(token)


def bypass_in_own_rule(key: Any, leaves: list) -> bool:
    """Inside its own rule, under an outer forward mode, a primitive is its plain function.

    An outer reverse mode (grad of grad) still goes through the lowering, so the rule also
    gives the derivative of the rule's own forward value.
    """
    return key in _active_rules.get() and any(map(_in_forward_mode, leaves))


def _in_forward_mode(x: Any) -> bool:
    """Whether `x` carries a forward-mode tangent at the innermost level (jax.jvp, jacfwd).

    Reverse mode traces with JAX's linearize tracers, so a JVP tracer here means pure forward
    mode, which `jax.custom_vjp` cannot serve. Detected by the tracer's class name (public
    behaviour, no private import); should JAX rename it, JAX's own TypeError is still turned
    into a `ForwardModeError` below for eager calls.
    """
    while isinstance(x, _Tracer):
        if type(x).__name__ == "JVPTracer":
            return True
        x = getattr(x, "val", None)  # a batching tracer wraps the value it batches
    return False


def is_tracer(x: Any) -> bool:
    return isinstance(x, _Tracer)


def _static_key(leaf: Any) -> Any:
    """The cache key of a static argument: values that compare equal but act differently differ.

    `1`, `True` and `np.int64(1)` are kept apart by type (as JAX's `static_argnums` does),
    `0.0` and `-0.0` (and NaNs) by their exact text.
    """
    if isinstance(leaf, (float, complex)):
        return type(leaf), repr(leaf)
    if type(leaf) in (tuple, list):
        return type(leaf), tuple(map(_static_key, leaf))
    return type(leaf), leaf


def _aux_key(treedef: Any) -> tuple:
    """The static (aux) data of every node of `treedef`, keyed as `_static_key` keys a static
    argument: a treedef compares its nodes' data with `==`, so a pytree with a static field
    `0.0` and one with `-0.0` (or `1` and `True`) would share a lowering, and its rules."""
    out, stack = [], [treedef]
    while stack:
        node = stack.pop()
        data = node.node_data()
        if data is not None and data[1] is not None:
            out.append((data[0], _static_key(data[1])))
        stack.extend(node.children())
    return tuple(out)


def _is_shard_map_only(leaves: list) -> bool:
    """Whether every tracer among `leaves` is an eager `shard_map` tracer (no AD at this level).

    `shard_map`'s eager trace drops custom derivative rules (it is never differentiated
    itself) and rejects `custom_vjp` with symbolic zeros, so the plain function is called.
    """
    bases = []
    for leaf in leaves:
        while type(leaf).__name__ == "BatchTracer":  # vmap inside shard_map: look through it
            leaf = leaf.val
        if isinstance(leaf, _Tracer):
            bases.append(leaf)
    return bool(bases) and all(type(t).__name__ == "ShardMapTracer" for t in bases)


_OUTPUT_TYPES = (*ArrayTypes, int, float, complex, bool, np.generic)


def _check_output_leaves(name: str, y: Any, source: str) -> None:
    if all(isinstance(leaf, _OUTPUT_TYPES) for leaf in jax.tree_util.tree_leaves(y)):
        return
    for path, leaf in jax.tree_util.tree_flatten_with_path(y)[0]:
        if not isinstance(leaf, _OUTPUT_TYPES):
            raise RuleDefinitionError(
                format_message(
                    f"primitive `{name}`: {source} holds a {type(leaf).__name__}, which JAX cannot trace",
                    argument=describe_argument("output", jax.tree_util.keystr(path)),
                    expected="arrays or Python numbers (pytrees of them)",
                    got=f"{type(leaf).__name__} {leaf!r:.60}",
                    fix="return only arrays from the primitive; compute labels and other Python objects "
                    "in a wrapper around it",
                )
            )


# ----- entry point ----------------------------------------------------------------------------
def call_lowered(prim: Any, args: tuple, kwargs: dict, leaves: list, treedef: Any) -> Any:
    """Call `prim` under a JAX transformation: through the lowering of its rules, if any."""
    if _is_shard_map_only(leaves):
        return prim.fn(*args, **kwargs)
    note_traced(prim)  # a later redefinition must clear JAX's trace caches
    rr, fr = lowered_rules(prim, args)
    if rr is None and fr is None:
        fr = getattr(prim, "_fallback_frule", None)  # an `external` with no rule: a clear error
        if fr is None:
            return prim.fn(*args, **kwargs)
    n_pos = treedef.children()[0].num_leaves
    # keyword arguments are never differentiated: arrays pass as dynamic non-differentiable
    # inputs, Python scalars are static (bound outside the rule, like `ord=np.inf`)
    kinds = tuple(leaf_kind(leaf, keyword=i >= n_pos) for i, leaf in enumerate(leaves))
    statics = tuple(leaf if k == STATIC else None for leaf, k in zip(leaves, kinds))
    dyn = [leaf for leaf, k in zip(leaves, kinds) if k != STATIC]
    # reverse mode (and no differentiation) through the rrule; forward mode through the
    # frule, or, for an rrule alone, through the transpose of its pullback
    if rr is None:
        mode = JVP
    elif _dual.ENABLED:
        mode = DUAL  # one primitive that JAX asks for the rule each transformation needs
    elif any(map(_in_forward_mode, dyn)):
        mode = JVP if fr is not None else JVP_BY_TRANSPOSE
    else:
        mode = VJP
    statics_key = tuple(_static_key(leaf) if k == STATIC else None for leaf, k in zip(leaves, kinds))
    key = (rr, fr, mode, treedef, _aux_key(treedef), kinds, statics_key)
    cache = prim._lowered
    try:
        lowered = cache.get(key)
    except TypeError:
        _raise_unhashable(prim, args, kwargs, kinds, treedef)
    if lowered is None:
        if len(cache) >= _CACHE_SIZE:
            cache.clear()
        lowered = cache[key] = _Lowered(prim, rr, fr, treedef, kinds, statics, mode)
    if mode == DUAL:
        return _dual.call(lowered, dyn)
    try:
        return lowered.fn(*dyn)
    except TypeError as err:
        if "forward-mode autodiff" in str(err) and "custom_vjp" in str(err):
            raise ForwardModeError(lowered.forward_mode_message()) from None
        raise


def lowered_rules(prim: Any, args: tuple) -> tuple[Any, Any]:
    """The (rrule, frule) implementations the lowering uses for `prim(*args)`.

    An rrule wins (custom_vjp), except one that declares its frule an exact equivalent
    (`__rules_lower_with_frule__`, set by `scalar_rule` and `non_differentiable`): then the
    frule is lowered through custom_jvp, which serves forward mode and, transposed, reverse.
    """
    rr, fr = rrule.lookup(prim, args), frule.lookup(prim, args)
    if rr is not None and fr is not None and getattr(rr, "__rules_lower_with_frule__", False):
        rr = None
    return rr, fr


def _raise_unhashable(prim, args, kwargs, kinds, treedef):
    paths = jax.tree_util.tree_flatten_with_path((args, kwargs))[0]
    for (path, leaf), k in zip(paths, kinds):
        if k != STATIC:
            continue
        try:
            hash(leaf)
        except TypeError:
            index = path[1].idx if path[0].idx == 0 else path[1].key
            raise StaticArgumentError(
                format_message(
                    f"primitive `{function_name(prim)}`: a static argument is not hashable",
                    argument=describe_argument(index, jax.tree_util.keystr(path[2:]), fn=prim),
                    expected="arrays, Python scalars, or hashable objects (static arguments key the lowering cache)",
                    got=f"an unhashable {type(leaf).__name__}",
                    fix="pass the data as an array, make the object hashable (e.g. a tuple or a frozen "
                    "dataclass), or register it as a pytree",
                )
            ) from None
    raise StaticArgumentError(f"primitive `{function_name(prim)}`: unhashable static arguments")


# ----- residuals ------------------------------------------------------------------------------
class _Residual:
    """What the forward pass leaves for the backward pass.

    Eager: the pullback closure itself (`eager`), kept as static data, since the forward
    values were concrete. Traced, for one differentiable output (whose only pattern is the
    dense one): the pullback's jaxpr, its output tree and the primitive's name (`dense`), its
    constants the residual arrays (`consts`). Traced, for more: the inputs are the residual
    arrays, and `live` (a `_Live`) calls the pullback once, with the pattern JAX hands over.
    `out_diff`: the differentiable outputs' leaf indices (static).
    """

    def __init__(self, eager, dense, live, consts, out_diff):
        self.eager, self.dense, self.live, self.consts, self.out_diff = eager, dense, live, consts, out_diff

    def run(self, pattern: tuple, gs: list) -> Any:
        if self.eager is not None:
            return self.eager(pattern, gs)
        if self.dense is not None:  # `bwd` runs nonempty patterns only: here, the dense one
            jaxpr, out_tree, name = self.dense
            return _evaluated(jaxpr, out_tree, self.consts, gs, name)
        return self.live(self.consts, pattern, gs)


class _Live:
    """The pullback closure of a traced forward pass, and the input tracers it was made from.

    Called with the inputs JAX hands back: where they are those very tracers, the closure runs
    in the trace they belong to, which is still open (`jax.jit(jax.grad(f))`, a `jax.vmap`
    around the differentiation). Anywhere else (the body of a `lax.scan`'s backward loop, a
    vjp function called after its `jax.jit` returned) the inputs are other objects, and the
    rrule runs again from them. Compared by identity, as the residual's static data.
    """

    __slots__ = ("lowered", "perturbed", "run", "values")

    def __init__(self, lowered: Any, perturbed: list, run: Any, values: list):
        self.lowered, self.perturbed, self.run, self.values = lowered, perturbed, run, tuple(values)

    def __call__(self, inputs: tuple, pattern: tuple, gs: list) -> Any:
        live = (
            any(map(is_tracer, self.values))  # a trace's own values: concrete ones prove nothing
            and len(inputs) == len(self.values)
            and all(a is b for a, b in zip(inputs, self.values))
        )
        run = self.run if live else self.lowered._rrule(list(inputs), self.perturbed)[3]
        return run(pattern, gs)


def _evaluated(jaxpr: Any, out_tree: Any, consts: Any, gs: list, name: str) -> Any:
    """The traced pullback of primitive `name` at the cotangents `gs`; where its trace raised
    (`out_tree` is the exception) it raises now, when JAX hands the cotangents over, as a
    `jax.custom_vjp`'s bwd would. A constant that is a tracer of a transformation now gone
    (the pullback closed over a `jax.vmap`'s value) raises `TracerClosureError`."""
    if jaxpr is None:
        raise out_tree
    with _naming(f"(raised in the pullback of `{name}`)", name):
        return jax.tree_util.tree_unflatten(out_tree, jax.core.eval_jaxpr(jaxpr, consts, *gs))


jax.tree_util.register_pytree_node(
    _Residual,
    lambda r: (r.consts, (r.eager, r.dense, r.live, r.out_diff)),
    lambda aux, consts: _Residual(aux[0], aux[1], aux[2], tuple(consts), aux[3]),
)


# ----- the lowered function -------------------------------------------------------------------
def _named(primal: Any, prim: Any) -> Any:
    """`primal` under the primitive's own name, which JAX prints in jaxprs
    (`custom_jvp_call[name=cube]`, not the method's name `primal`)."""

    def named(*dyn):
        return primal(*dyn)

    named.__name__ = named.__qualname__ = getattr(prim, "__name__", None) or "primitive"
    return named


def _shape_dtype(leaf: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(np.shape(leaf), jnp.result_type(leaf))


class _Lowered:
    """The custom_vjp/custom_jvp function of one primitive for one argument signature."""

    def __init__(self, prim, rr, fr, treedef, kinds, statics, mode=VJP):
        self.prim, self.name = prim, getattr(prim, "name_in_messages", None) or function_name(prim)
        self.rr, self.fr, self.mode = rr, fr, mode
        self.treedef, self.kinds, self.statics = treedef, kinds, statics
        self.dyn_index = [i for i, k in enumerate(kinds) if k != STATIC]
        self.dyn_pos = {flat: d for d, flat in enumerate(self.dyn_index)}
        self.arg_treedefs = treedef.children()[0].children()
        self.nargs = len(self.arg_treedefs)
        starts = np.cumsum([0] + [t.num_leaves for t in self.arg_treedefs])
        self.arg_ranges = [(int(starts[i]), int(starts[i + 1])) for i in range(self.nargs)]
        self._out_types: dict = {}
        n_pos = treedef.children()[0].num_leaves
        # dynamic inputs given by keyword: constants to the rules (checked when differentiated)
        self.keyword_inputs = [(d, flat) for d, flat in enumerate(self.dyn_index) if flat >= n_pos]
        self.hi_out_types: dict = {}  # DUAL: output avals and tree per input avals
        if mode == DUAL:
            fn = None  # called through `_dual.call`
        elif mode == VJP:
            fn = jax.custom_vjp(_named(self.primal, prim))
            fn.defvjp(self.fwd, self.bwd, symbolic_zeros=True)
        else:
            fn = jax.custom_jvp(_named(self.primal, prim))
            fn.defjvp(self.jvp if mode == JVP else self.jvp_by_transpose, symbolic_zeros=True)
        self.fn = fn

    def rebuild(self, dyn_values) -> tuple[tuple, dict]:
        return rebuilt(self.treedef, self.statics, self.dyn_index, dyn_values)

    def primal(self, *dyn):
        args, kwargs = self.rebuild(dyn)
        y = self.prim.fn(*args, **kwargs)
        _check_output_leaves(self.name, y, "its output")
        return y

    def evaluated(self, dyn: list, error: Exception) -> Any:
        """The function's output on the concrete values behind `dyn`, where an abstract trace
        raised `error` (a function that branches on its argument's value): eagerly, as plain
        JAX runs such a function; under `jit`, where there are no values, `error` stands."""
        values = [concrete_value(v) for v in dyn]
        if any(v is None for v in values):
            raise error
        return self.primal(*values)

    def check_rule_primal(self, kind: str, dyn: list, y: Any) -> None:
        """The rule's primal output must have the function's structure, shapes and dtypes.

        The function's output type is found by `jax.eval_shape` once per input signature.
        """
        sig = tuple(
            (v.shape, v.dtype, getattr(v, "weak_type", False))  # key arrays have no weak_type
            if isinstance(v, jax.Array) else (type(v), np.shape(v), getattr(v, "dtype", None))
            for v in dyn
        )
        want = self._out_types.get(sig)
        if want is None:
            try:
                want = self._out_types[sig] = jax.eval_shape(self.primal, *dyn)
            except VALUE_DEPENDENT as error:  # the type may depend on the values: not kept
                want = jax.tree_util.tree_map(_shape_dtype, self.evaluated(dyn, error))
        if isinstance(y, jax.Array) and isinstance(want, jax.ShapeDtypeStruct):  # the common case, fast
            if y.shape == want.shape and y.dtype == want.dtype:
                return
        _check_output_leaves(self.name, y, f"the {kind}'s primal output")
        want_leaves, want_tree = jax.tree_util.tree_flatten(want)
        got_leaves, got_tree = jax.tree_util.tree_flatten(y)
        if want_tree != got_tree:
            problem, expected, got = "structure", str(want_tree), str(got_tree)
        else:
            bad = [
                (k, w, g) for k, (w, g) in enumerate(zip(want_leaves, got_leaves))
                if tuple(w.shape) != np.shape(g) or w.dtype != jnp.result_type(g)
            ]
            if not bad:
                return
            k, w, g = bad[0]
            problem = "shape and dtype" + (f" (output leaf {k})" if len(want_leaves) > 1 else "")
            expected = f"shape {tuple(w.shape)}, dtype {w.dtype}"
            got = f"shape {np.shape(g)}, dtype {jnp.result_type(g)}"
        raise RuleDefinitionError(
            format_message(
                f"the {kind} of `{self.name}` returned a primal output whose {problem} differs from "
                f"`{self.name}`'s own",
                expected=f"{expected} (what `{self.name}` returns, by jax.eval_shape)",
                got=got,
                fix=f"return `{self.name}(...)`'s value (or an array of its shape and dtype) as the "
                "first item of the rule's result",
            )
        )

    def forward_mode_message(self, reason: str | None = None) -> str:
        if reason is None:  # JAX's own error: forward mode through a linearization (jax.linearize)
            return format_message(
                f"forward-mode evaluation of a linearization of primitive `{self.name}` is not "
                "possible: reverse mode (jax.vjp, jax.grad) and jax.linearize trace its rrule as a "
                "`jax.custom_vjp`, whose linearization JAX can only transpose",
                fix="use jax.jvp or jax.jacfwd (they use the frule, or the transposed pullback), "
                "or reverse mode",
            )
        return format_message(
            f"forward-mode differentiation (jax.jvp, jax.jacfwd) of primitive `{self.name}` is not "
            "possible: it has an rrule and no frule, and the rrule's pullback cannot be transposed "
            "into a pushforward",
            got=reason,
            fix=f"define an frule (`@{getattr(self.prim, '__name__', self.name)}.frule`), which serves "
            "forward mode while the rrule keeps serving reverse mode; or use reverse mode (jax.grad, "
            "jax.vjp, jax.jacrev)",
        )

    # ----- reverse mode: jax.custom_vjp ---------------------------------------------------
    def fwd(self, *dyn_primals):
        """The rrule's forward pass (`jax.custom_vjp`'s fwd, and `_dual`'s): the output and
        the residual for `bwd`."""
        values = [p.value for p in dyn_primals]
        perturbed = [p.perturbed for p in dyn_primals]
        self._check_keywords_not_differentiated(perturbed)
        y, y_leaves, out_diff, run = self._rrule(values, perturbed, check=True)
        if not any(map(is_tracer, values)) and not any(map(is_tracer, y_leaves)):
            return y, _Residual(run, None, None, (), out_diff)
        # Traced: the closure holds this trace's values. With one differentiable output the dense
        # pattern is the only one bwd runs: the pullback is traced now. With more, the pattern is
        # known only in the backward pass, which calls the closure where it is live (`_Live`),
        # else runs the rrule again from the inputs; either way once, with that pattern.
        if len(out_diff) > 1:
            return y, _Residual(None, None, _Live(self, perturbed, run, values), tuple(values), out_diff)
        aval = jax.typeof(y_leaves[out_diff[0]])  # keeps shard_map's varying axes
        try:
            closed, out_shape = jax.make_jaxpr(lambda g: run(out_diff, [g]), return_shape=True)(aval)
        except Exception as err:  # noqa: BLE001 - raised if bwd runs, as JAX would call bwd
            return y, _Residual(None, (None, err, self.name), None, (), out_diff)
        dense = (closed.jaxpr, jax.tree_util.tree_structure(out_shape), self.name)
        return y, _Residual(None, dense, None, tuple(closed.consts), out_diff)

    def _rrule(self, values: list, perturbed: list, check: bool = False):
        """The rrule at the dynamic inputs `values`: its output (`check`: checked against the
        function's), the output's leaves, the differentiable ones' indices, and its pullback as
        a function of their nonzero cotangents (`pattern`: their leaf indices)."""
        args, kwargs = self.rebuild(values)
        with _running_rule_of(self.prim.__rules_key__), _naming(f"(raised in the rrule of `{self.name}`)", self.name):
            y, pullback = check_rrule_result(self.prim, self.rr(*args, **kwargs))
        if check:
            self.check_rule_primal("rrule", values, y)
        y_leaves, y_tree = jax.tree_util.tree_flatten(y)
        out_diff = tuple(i for i, leaf in enumerate(y_leaves) if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact))
        metas = [(np.shape(v), jnp.result_type(v)) for v in values]

        def run(pattern, gs):
            y_bar = pullback_seed(y_leaves, y_tree, out_diff, pattern, gs)
            with _naming(f"(raised in the pullback of `{self.name}`)", self.name):
                cotangents = pullback(y_bar)
            return to_jax_cotangents(self, cotangents, args, perturbed, metas)

        return y, y_leaves, out_diff, run

    def bwd(self, residual, g):
        g_leaves = jax.tree_util.tree_leaves(g, is_leaf=is_jax_zero)
        g_all = [g_leaves[i] for i in residual.out_diff]  # JAX's zeros stay JAX's (`pullback_seed`)
        pattern = tuple(i for i, gi in zip(residual.out_diff, g_all) if not is_jax_zero(gi))
        if not pattern:
            return (None,) * len(self.dyn_index)
        return residual.run(pattern, [gi for gi in g_all if not is_jax_zero(gi)])

    # ----- forward mode: jax.custom_jvp ---------------------------------------------------
    def jvp(self, primals, tangents):
        self._check_keywords_not_differentiated(tangents)
        args, kwargs = self.rebuild(primals)
        arg_tangents = frule_tangents(self, tangents)
        # No "own rule" mark here: custom_jvp recursion ends by itself (each level peels off one
        # tangent), and an frule calling its own primitive keeps its derivative differentiable.
        with _naming(lambda: self._frule_note(args)):
            try:
                y, y_dot = check_frule_result(self.prim, self.fr(arg_tangents, *args, **kwargs))
            except ValueError as err:
                if "unpack" not in str(err):
                    raise
                raise RuleDefinitionError(
                    format_message(
                        f"the frule of `{self.name}` unpacked its tangents wrongly: {err}",
                        expected=f"`tangents` holds {1 + self.nargs} items: the function's own tangent first, "
                        f"then one per positional argument: (f_dot, {self._slots('_dot')})",
                        fix="write `_, x_dot = tangents` for one argument, `_, x_dot, y_dot = tangents` for two",
                    )
                ) from err
        self.check_rule_primal("frule", list(primals), y)
        return y, to_jax_tangent(self, y_dot, y)

    def jvp_by_transpose(self, primals, tangents):
        """Forward mode from an rrule alone (the `jax.custom_jvp` fallback): its forward pass,
        then `transposed_pullback`."""
        self._check_keywords_not_differentiated(tangents)
        perturbed = [
            self.kinds[flat] == DIFF and not isinstance(t, SymbolicZero) for flat, t in zip(self.dyn_index, tangents)
        ]
        y, residual = self.fwd(*[_dual._Primal(v, p) for v, p in zip(primals, perturbed)])
        y_leaves, y_tree = jax.tree_util.tree_flatten(y)
        moved = [d for d, p in enumerate(perturbed) if p]
        in_avals = [jax.typeof(v) for v in primals]
        y_dots = self.transposed_pullback(residual, in_avals, [jax.typeof(v) for v in y_leaves], moved, [tangents[d] for d in moved])
        return y, rebuilt(y_tree, [zero_tangent_of(leaf) for leaf in y_leaves], residual.out_diff, y_dots)

    def transposed_pullback(self, residual, in_avals, out_avals, moved, ts) -> list:
        """The pushforward of an rrule alone: its pullback transposed, applied to the tangents
        `ts` of the `moved` inputs; one tangent per differentiable output.

        The pullback, in JAX's convention, is linear in the output cotangent; where it is built
        from transposable operations, `jax.linear_transpose` turns it into the pushforward.
        """
        diff = residual.out_diff

        def pullback_in_jax_convention(*gs):
            x_bars = self.bwd(residual, filled([SymbolicZero(a.to_tangent_aval()) for a in out_avals], diff, gs))
            return tuple(jnp.zeros(in_avals[d].shape, in_avals[d].dtype) if x_bars[d] is None else x_bars[d] for d in moved)

        seeds = [jax.ShapeDtypeStruct(out_avals[i].shape, out_avals[i].dtype) for i in diff]
        try:
            return list(jax.linear_transpose(pullback_in_jax_convention, *seeds)(tuple(ts)))
        except RuleError:
            raise
        except Exception as err:  # JAX cannot transpose it: a while_loop, a non-linear use of y_bar
            raise ForwardModeError(
                self.forward_mode_message(f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}")
            ) from err

    def _check_keywords_not_differentiated(self, perturbed: list) -> None:
        """A float array given by keyword is a constant to the rule: differentiating it is an error.

        Its derivative would otherwise be zero, silently. `perturbed` holds, per dynamic input,
        a bool (reverse mode) or its tangent (forward mode: perturbed unless a symbolic zero).
        """
        for d, flat in self.keyword_inputs:
            p = perturbed[d]
            if not (p is True or (p is not False and not isinstance(p, SymbolicZero))):
                continue
            _, numbered = jax.tree_util.tree_unflatten(self.treedef, list(range(len(self.kinds))))
            where = next(jax.tree_util.keystr(path) for path, k in jax.tree_util.tree_flatten_with_path(numbered)[0] if k == flat)
            raise RuleDefinitionError(
                format_message(
                    f"primitive `{self.name}`: an array given by keyword is being differentiated, "
                    "but keyword arguments are constants to its rules (their derivative would be "
                    "zero, silently)",
                    argument=f"keyword argument {where}",
                    expected="differentiated arrays passed positionally",
                    got="a float array by keyword that JAX is differentiating",
                    fix="pass it positionally, or wrap it in jax.lax.stop_gradient if it is a constant",
                )
            )

    def _slots(self, suffix: str) -> str:
        """`x_bar, y_bar`: the argument slots of a rule's result, by parameter name."""
        return ", ".join(f"{parameter_name(self.prim, i) or f'x{i + 1}'}{suffix}" for i in range(self.nargs))

    def _frule_note(self, args) -> str:
        return f"(raised in the frule of `{self.name}`, called with {1 + len(args)} tangents (f_dot, x1_dot, ...))"
