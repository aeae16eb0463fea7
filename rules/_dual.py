"""Dual-mode lowering: a primitive with an rrule becomes one JAX primitive that keeps its rules.

`jax.custom_vjp` cannot serve forward mode, and a choice made when the primitive is called
(frule under `jax.jvp`, rrule otherwise) is frozen into any jaxpr traced before the
differentiation: `jax.jvp(jax.jit(f))`, `jax.linearize`, a `scan` body. Here the primitive
is staged as a JAX primitive of ours, `rules_call`, with the three rules every JAX primitive
has had for years (`jax.interpreters.ad.primitive_jvps`, `primitive_transposes`, and a
batching rule):

* its JVP rule returns, as the output tangent, a `_Linear` operation of the primals, the
  rrule's residuals and the input tangents (where JAX linearizes, and for an rrule alone,
  the rrule's forward pass runs first; for forward mode with an frule it does not);
* `_Linear` is linear in the tangents. Transposed (`jax.grad`, `jax.vjp`: JAX linearizes by
  partially evaluating the JVP rule, then transposes) it runs the pullback on the
  residuals; evaluated (`jax.jvp`, `jax.jacfwd`, `jax.linearize`) it runs the frule, or, for
  an rrule alone, the transposed pullback;
* `jax.vmap`: `_Batched`, the same protocol with every function vmapped;
* evaluation and compilation: the function itself (`mlir.lower_fun`).

So whichever transformation JAX applies, and whatever was traced first (a `jax.jit`, a
`scan` body, `jax.checkpoint`, which differentiates by JVP and transposition), reverse mode
runs the rrule and forward mode the frule. Where this JAX's newer linearization rules
(`primitive_linearizations`, whose contract changed in jax 0.11.1) have a contract that
`_jax_compat.linearize_contract` knows, `check_footing` adds one built from the same
`_Linear` (`_call_linearize`: eager reverse mode is ~0.15 ms faster with it); everything
works without it. The JAX names come from `_jax_compat`; without them the lowering falls
back to `jax.custom_vjp` / `jax.custom_jvp` (the mode then chosen when the primitive is
called; docs/design.md).

The rules themselves, and every conversion between ChainRules' tangents and JAX's, stay in
`_lowering._Lowered`; this module only routes.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from ._boundary import filled, is_jax_zero
from ._errors import LoweringContractError, format_message
from ._jax_compat import VALUE_DEPENDENT
from ._jax_compat import (
    DUAL,
    ENABLED,
    JAX_VERSION,
    LINEARIZATIONS,
    fallback_linearize,
    linearize_contract,
    outside_partial_eval,
    pcast_varying,
    unmapped_aval,
    varying_axes,
)

__all__ = ["AVAILABLE", "ENABLED", "call", "forward_mode_required"]

AVAILABLE = DUAL is not None  # this JAX has what the dual-mode lowering needs
_CACHE_SIZE = 512  # signatures remembered per lowering (output types)

# Set by `forward_mode_required`: a pushforward that cannot be evaluated raises when traced.
_strict_forward: contextvars.ContextVar[bool] = contextvars.ContextVar("rules_strict_forward", default=False)


@contextlib.contextmanager
def forward_mode_required() -> Iterator[None]:
    """Inside, forward mode through an rrule whose pullback JAX cannot transpose raises
    `ForwardModeError` when traced, not when evaluated or compiled (for a caller that falls
    back to reverse mode, as `zygote_jax.hessian` does, also under `jax.jit`).

    Outside, the error waits for the pushforward to be evaluated: `jax.checkpoint`
    differentiates by JVP and transposition, and the transposition runs the rrule.
    """
    token = _strict_forward.set(True)
    try:
        yield
    finally:
        _strict_forward.reset(token)


def _tangent_aval(aval: Any) -> Any:
    return aval.to_tangent_aval()


def _inexact(aval: Any) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


class _Primal:
    """The (value, perturbed) pair that `_Lowered.fwd` reads (as jax.custom_vjp's own)."""

    __slots__ = ("value", "perturbed")

    def __init__(self, value: Any, perturbed: bool):
        self.value, self.perturbed = value, perturbed


if DUAL is not None:
    _Zero = DUAL.Zero

    def _linearizing(tangents: list) -> bool:
        """Whether JAX calls the JVP rule to linearize (jax.grad, jax.vjp, jax.linearize): it
        partially evaluates the rule with unknown tangents (looked at through vmap's tracers)."""
        for t in tangents:
            while type(t).__name__ == "BatchTracer":
                t = t.val
            if isinstance(t, DUAL.PartialEvalTracer):
                return True
        return False

    class _Hi:
        """An operation of the dual-mode lowering, as the parameter `op` of `rules_call_p`.

        Subclasses implement, on flat lists of arrays: `expand_flat` (evaluation), `jvp_flat`
        and, when linear in some inputs, `transpose_flat`. A zero tangent or cotangent is
        JAX's `Zero`; a cotangent that is not there is None.
        """

        def __init__(self, in_avals, out_avals, key: tuple):
            self.in_avals, self.out_aval = tuple(in_avals), tuple(out_avals)
            self._key = (type(self).__name__, key, self.in_avals, self.out_aval)
            self._hash = hash(self._key)

        def __call__(self, *args):
            return rules_call_p.bind(*args, op=self)

        def __hash__(self) -> int:
            return self._hash

        def __eq__(self, other: Any) -> bool:
            return type(other) is type(self) and other._key == self._key

        def batch(self, axis_data, args, dims):
            if all(d is None for d in dims):  # JAX may ask even when nothing is batched
                return self(*args), [None] * len(self.out_aval)
            moved = [a if d is None or d == 0 else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
            batched = _Batched(self, tuple(None if d is None else 0 for d in dims), axis_data)
            return batched(*moved), [0] * len(self.out_aval)

        def expand_flat(self, args: list) -> list:
            raise NotImplementedError

        def transpose_flat(self, cts, args):
            raise NotImplementedError(f"{self!r} is not linear in its inputs")

        def __repr__(self) -> str:
            return f"{type(self).__name__.strip('_').lower()}[{self.label()}]"

        def label(self) -> str:
            raise NotImplementedError

    class _RulesCall(_Hi):
        """A primitive at one signature: the function, its rrule and its frule (if any)."""

        def __init__(self, lowered, in_avals, out_avals):
            self.lowered = lowered
            super().__init__(in_avals, out_avals, (lowered,))

        def label(self) -> str:
            return self.lowered.name

        def expand_flat(self, args):
            return jax.tree_util.tree_leaves(self.lowered.primal(*args))

        def jvp_flat(self, primals, tangents):
            """The output tangents: a `_Linear` of the moved inputs.

            Where JAX linearizes (reverse mode), and for an rrule alone, the rrule's forward
            pass runs now and `_Linear` gets its residuals. In forward mode with an frule, it
            does not: `_Linear` runs the frule, and only a transposition of it (`jax.checkpoint`
            differentiates by JVP and transposition) runs the forward pass, from the primals.
            """
            moved = tuple(i for i, t in enumerate(tangents) if not is_jax_zero(t) and _inexact(jax.typeof(t)))
            out_dot = [_Zero(_tangent_aval(a)) for a in self.out_aval]
            diff = [i for i, a in enumerate(self.out_aval) if _inexact(a)]
            if not moved or not diff:
                return list(self(*primals)), out_dot
            linearizing = _linearizing(tangents)
            y_leaves, lin, res_leaves = self._linear(primals, moved, linearizing, beneath=True)
            args = [*primals, *res_leaves, *[tangents[i] for i in moved]]
            if self.lowered.fr is None and _strict_forward.get() and not linearizing:
                jax.eval_shape(lambda *a: tuple(lin.expand_flat(list(a))), *args)  # raises ForwardModeError
            return y_leaves, filled(out_dot, diff, lin(*args))

        def linearize_flat(self, is_vjp, nzs, primals):
            """JAX's linearization rule, where this JAX has one we know (`_call_linearize`): what
            the JVP rule and JAX's partial evaluation of it give, built directly. `is_vjp` says
            the result will only be transposed (jax.grad, jax.vjp)."""
            moved = tuple(i for i, (nz, a) in enumerate(zip(nzs, self.in_avals)) if nz and _inexact(a))
            diff = [i for i, a in enumerate(self.out_aval) if _inexact(a)]
            zeros = [_Zero(_tangent_aval(a)) for a in self.out_aval]
            if not moved or not diff:
                return list(self(*primals)), [False] * len(zeros), [], lambda res, *ts: list(zeros)
            # JAX runs a linearization rule on the trace beneath already
            y_leaves, lin, res_leaves = self._linear(primals, moved, is_vjp, beneath=False)

            def linearized(res, *tangents):
                outs, out_dot = iter(lin(*res, *[tangents[i] for i in moved])), list(zeros)
                for i in diff:
                    out_dot[i] = next(outs)
                return out_dot

            return y_leaves, [i in diff for i in range(len(zeros))], [*primals, *res_leaves], linearized

        def _linear(self, primals, moved, for_reverse: bool, beneath: bool):
            """The output leaves, the `_Linear` of the `moved` inputs and its residual leaves.

            The rrule's forward pass runs now for reverse mode and for an rrule alone (its
            transposed pullback reuses the residuals); for forward mode with an frule it does
            not, and `_Linear` has no residuals (a transposition of it runs the forward pass).
            """
            if for_reverse or self.lowered.fr is None:
                y_leaves, residual = _forward_pass(self.lowered, primals, moved, beneath)
                res_leaves, res_tree = jax.tree_util.tree_flatten(residual)
            else:
                y_leaves, res_leaves, res_tree = list(self(*primals)), [], None
            return y_leaves, _Linear(self, moved, res_tree, [jax.typeof(r) for r in res_leaves]), res_leaves

    class _Linear(_Hi):
        """The output tangents of a `_RulesCall`, linear in the tangents of the `moved` inputs.

        Inputs: the primitive's inputs, the residuals of its rrule's forward pass (none if
        `res_tree` is None: then the forward pass runs when they are needed), then the
        tangents of the moved inputs. Transposed, it runs the pullback on the residuals;
        evaluated, the frule (or, for an rrule alone, the transposed pullback).
        """

        def __init__(self, call, moved, res_tree, res_avals):
            self.call, self.lowered, self.moved, self.res_tree = call, call.lowered, tuple(moved), res_tree
            self.n, self.n_res = len(call.in_avals), len(res_avals)
            tangent_avals = [_tangent_aval(call.in_avals[i]) for i in moved]
            out_avals = [_tangent_aval(a) for a in call.out_aval if _inexact(a)]
            # the residuals' structure tagged: PyTreeDef's == raises on None (a flaky CI failure where
            # JAX compared a forward-mode op, made without residuals, with a reverse-mode one)
            tree_key = ("none",) if res_tree is None else ("tree", res_tree)
            super().__init__((*call.in_avals, *res_avals, *tangent_avals), out_avals, (call, self.moved, tree_key))

        def label(self) -> str:
            return f"pushforward of {self.lowered.name}"

        def _split(self, args) -> tuple[list, Any, list]:
            """The primals, the residuals (None if made without) and the tangents."""
            primals, ts = list(args[: self.n]), list(args[self.n + self.n_res :])
            if self.res_tree is None:
                return primals, None, ts
            return primals, jax.tree_util.tree_unflatten(self.res_tree, args[self.n : self.n + self.n_res]), ts

        def expand_flat(self, args):
            primals, residual, ts = self._split(args)
            if self.lowered.fr is None:
                return self.lowered.transposed_pullback(residual, self.call.in_avals, self.call.out_aval, self.moved, ts)
            tangents = filled([SymbolicZero(_tangent_aval(a)) for a in self.call.in_avals], self.moved, ts)
            y, y_dot = self.lowered.jvp(primals, tangents)
            leaves = jax.tree_util.tree_leaves(y_dot, is_leaf=lambda t: isinstance(t, SymbolicZero))
            return [  # a symbolic zero (an frule's ZeroTangent) made an array: this op's outputs are values
                _dense(leaves[i], leaf) for i, leaf in enumerate(jax.tree_util.tree_leaves(y)) if _inexact(jax.typeof(leaf))
            ]

        def transpose_flat(self, cts, args):
            if any(a is None for a in args[: self.n + self.n_res]):  # pragma: no cover - JAX keeps them known
                raise NotImplementedError(f"{self!r} is linear only in its tangents")
            primals, residual, _ = self._split(args)
            if residual is None:  # made in forward mode, transposed after all: the forward pass now
                residual = _forward_pass(self.lowered, primals, self.moved)[1]
            x_bars = self.lowered.bwd(residual, _with_zeros(self.call.out_aval, cts))
            return [None] * (self.n + self.n_res) + [x_bars[i] for i in self.moved]

        def jvp_flat(self, primals, tangents):
            """Second order (a derivative of the tangent itself): JAX differentiates the rule."""
            dense = [_instantiate(t, a) for t, a in zip(tangents, self.in_avals)]
            out, out_dot = jax.jvp(lambda *a: tuple(self.expand_flat(list(a))), tuple(primals), tuple(dense))
            return list(out), list(out_dot)

    class _Batched(_Hi):
        """`inner` under `jax.vmap`: each function of the protocol vmapped, batch axis 0.

        `dims[i]` is 0 for a batched input, None otherwise; every output is batched. An
        input that is not batched (a weight matrix under a vmap over examples, or a residual
        that depends only on it) stays as it is.
        """

        def __init__(self, inner, dims, axis_data):
            self.inner, self.dims, self.axis_data = inner, tuple(dims), axis_data
            size, mesh_axis = axis_data.size, axis_data.explicit_mesh_axis
            in_avals = [a if d is None else unmapped_aval(size, 0, a, mesh_axis) for a, d in zip(inner.in_avals, dims)]
            out_avals = [unmapped_aval(size, 0, a, mesh_axis) for a in inner.out_aval]
            super().__init__(in_avals, out_avals, (inner, self.dims, axis_data))

        def label(self) -> str:
            return f"vmap of {self.inner.label()}"

        def _vmap(self, fn, in_axes, out_axes: Any = 0):
            ad_ = self.axis_data
            return jax.vmap(
                fn, in_axes=in_axes, out_axes=out_axes, axis_size=ad_.size, axis_name=ad_.name,
                spmd_axis_name=ad_.spmd_name or ad_.explicit_mesh_axis,
            )

        def _sum_unbatched(self, cts):
            return [ct if ct is None or d is not None else ct.sum(0) for ct, d in zip(cts, self.dims)]

        def expand_flat(self, args):
            return self._vmap(lambda *a: list(self.inner.expand_flat(list(a))), self.dims)(*args)

        def jvp_flat(self, primals, tangents):
            nz = [not is_jax_zero(t) for t in tangents]
            nz_dims = [d for d, n in zip(self.dims, nz) if n]

            def f(ps, ts):
                it = iter(ts)
                inner_ts = [next(it) if n else _Zero(_tangent_aval(a)) for n, a in zip(nz, self.inner.in_avals)]
                out, out_dot = self.inner.jvp_flat(list(ps), inner_ts)
                return list(out), list(out_dot)

            out, out_dot = self._vmap(f, (list(self.dims), nz_dims))(primals, [t for t, n in zip(tangents, nz) if n])
            # zeros come out of vmap with the inner aval: give them the batched one
            return out, [_Zero(_tangent_aval(a)) if is_jax_zero(t) else t for t, a in zip(out_dot, self.out_aval)]

        def transpose_flat(self, cts, args):
            nz = [not is_jax_zero(ct) for ct in cts]
            known = [a is not None for a in args]

            def f(gs, vals):
                g_it, v_it = iter(gs), iter(vals)
                full_cts = [next(g_it) if n else _Zero(_tangent_aval(a)) for n, a in zip(nz, self.inner.out_aval)]
                full_args = [next(v_it) if k else None for k in known]
                return list(self.inner.transpose_flat(full_cts, full_args))

            known_dims = [d for d, k in zip(self.dims, known) if k]
            got = self._vmap(f, (0, known_dims))([ct for ct, n in zip(cts, nz) if n], [a for a in args if a is not None])
            return self._sum_unbatched(got)

    # ----- the JAX primitive ------------------------------------------------------------------
    # `rules_call`: any `_Hi` operation, which says how to evaluate, batch, differentiate and
    # transpose it. An ordinary (not "hijax") primitive, so jax.jit caches its traces and
    # dispatches compiled programs on its fast path.
    rules_call_p = DUAL.Primitive("rules_call")
    rules_call_p.multiple_results = True

    def _expand(*args, op):
        return list(op.expand_flat(list(args)))

    rules_call_p.def_impl(_expand)
    rules_call_p.def_abstract_eval(lambda *avals, op: list(op.out_aval))
    DUAL.register_lowering(rules_call_p, DUAL.lower_fun(_expand, multiple_results=True))

    def _call_jvp(primals, tangents, *, op):
        out, out_dot = op.jvp_flat(list(primals), list(tangents))
        return list(out), list(out_dot)

    def _call_transpose(cts, *args, op):
        return list(op.transpose_flat(list(cts), [None if DUAL.is_undefined_primal(a) else a for a in args]))

    def _call_batch(axis_data, args, dims, *, op):
        return op.batch(axis_data, list(args), list(dims))

    def _call_linearize(is_vjp, nzs, *primals, op):
        """JAX's linearization rule (registered by `check_footing` where `linearize_contract()`
        knows the contract): `_RulesCall`s (and the footing check's probe) directly, the other
        operations by JAX's own rule from the JVP rule."""
        if not hasattr(op, "linearize_flat"):
            return fallback_linearize(rules_call_p, is_vjp, nzs, *primals, op=op)
        out, nzs_out, residuals, linearized = op.linearize_flat(is_vjp, nzs, list(primals))
        if _linearize_values[0] == 4:
            return out, nzs_out, residuals, linearized
        return out, nzs_out, residuals, None, lambda res, _structured, *ts: linearized(res, *ts)

    DUAL.primitive_jvps[rules_call_p] = _call_jvp
    DUAL.primitive_transposes[rules_call_p] = _call_transpose
    DUAL.fancy_primitive_batchers[rules_call_p] = _call_batch

    def _forward_pass(lowered, primals, moved, beneath: bool = True) -> tuple[list, Any]:
        """The rrule's forward pass: the output leaves and the residuals for its pullback.

        Where JAX linearizes by partially evaluating the JVP rule, it runs (`beneath`) on the
        trace beneath (`outside_partial_eval`), as JAX runs a `jax.custom_vjp`'s forward pass:
        in an eager `jax.grad` the rrule is plain eager code and its pullback a Python closure.
        """
        with outside_partial_eval(primals) if beneath else contextlib.nullcontext():
            y, residual = lowered.fwd(*[_Primal(v, i in moved) for i, v in enumerate(primals)])
        return jax.tree_util.tree_leaves(y), residual

    def _with_zeros(out_avals, cts) -> list:
        """Cotangents of every output: `cts` for the inexact ones, in order, zeros for the rest."""
        it = iter(cts)
        return [next(it) if _inexact(a) else _Zero(_tangent_aval(a)) for a in out_avals]

    def _dense(t: Any, like: Any) -> Any:
        """`t`, or for a symbolic zero the zero tangent of the output `like`, with its varying axes."""
        if not isinstance(t, SymbolicZero):
            return t
        zero = jnp.zeros(jnp.shape(like), jnp.result_type(like))
        axes = varying_axes(like)
        return pcast_varying(zero, axes) if axes else zero

    def _instantiate(t: Any, aval: Any) -> Any:
        if not is_jax_zero(t):
            return t
        tangent = _tangent_aval(aval)
        return jnp.zeros(tangent.shape, tangent.dtype)


# ----- the footing's check on first use -------------------------------------------------------
_footing: list = []  # after the first call: [None] if this JAX keeps the contract, else [the error]
_linearize_values = [0]  # what the registered linearization rule returns: 4 or 5 values (0: none)


def check_footing() -> None:
    """Raise `LoweringContractError` if this JAX does not keep the contract `rules_call` is
    built on: checked once, on the first call, by tracing a small operation (sin, with its
    derivative by our JVP, transpose and batching rules) under jax.vjp, jax.jit(jax.grad),
    jax.jvp, jax.linearize and jax.vmap.

    Where `linearize_contract()` knows this JAX's linearization rules, `rules_call` gets one
    too (eager reverse mode is faster with it) and is checked with it; if that check fails,
    the rule is taken away again and the JVP rule serves alone, as on a JAX whose contract
    is not known. A future JAX that breaks the JVP footing itself fails here, naming its
    version and the way out, rather than deep inside JAX or with a wrong number.
    """
    if not _footing:
        n = linearize_contract() if LINEARIZATIONS is not None else 0
        problem = None
        if n:
            _linearize_values[0] = n
            LINEARIZATIONS[rules_call_p] = _call_linearize
            problem = _footing_problem()
            if problem is not None:  # a contract we do not know after all: the JVP rule alone
                del LINEARIZATIONS[rules_call_p]
                _linearize_values[0] = 0
        if not n or problem is not None:
            problem = _footing_problem()
        _footing.append(problem)
    if _footing[0] is not None:
        raise LoweringContractError(_footing[0])


def _footing_problem() -> str | None:
    spec = jax.ShapeDtypeStruct((2,), jnp.float32)
    batch = jax.ShapeDtypeStruct((3, 2), jnp.float32)
    f = lambda v: _ProbeSin((jax.typeof(v),), (jax.typeof(v),), ())(v)[0]  # noqa: E731
    routes = {  # traced only (no compilation: this runs on every first use)
        "jax.vjp": (lambda x, t: jax.vjp(f, x)[1](t)[0], spec),
        "jax.jit(jax.grad)": (lambda x, t: jax.jit(jax.grad(lambda v: jnp.sum(f(v) * t)))(x), spec),
        "jax.jvp": (lambda x, t: jax.jvp(f, (x,), (t,))[1], spec),
        "jax.linearize": (lambda x, t: jax.linearize(f, x)[1](t), spec),
        "jax.vmap(jax.vjp)": (jax.vmap(lambda x, t: jax.vjp(f, x)[1](t)[0]), batch),
    }
    for name, (route, arg) in routes.items():
        try:
            closed = jax.make_jaxpr(route)(arg, arg)
            ok = [(a.shape, a.dtype) for a in closed.out_avals] == [(arg.shape, arg.dtype)] and "cos" in str(closed)
            got = f"a derivative of another type or not by the operation's own rule under {name}: {closed}"
        except Exception as err:  # noqa: BLE001 - any failure on JAX's side is the finding
            ok, got = False, f"{name} raised {type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
        if not ok:
            return format_message(
                f"the dual-mode lowering of rules does not work on jax {JAX_VERSION}: a primitive's JVP, "
                f"transpose and batching rules no longer behave as it expects ({name})",
                expected="JAX calling the JVP rule, the transpose rule and the batching rule of a primitive",
                got=got[:600],
                fix="set ZYGOTE_JAX_LOWERING=custom_vjp before importing rules (jax.custom_vjp / "
                "jax.custom_jvp, the mode chosen when a primitive is called), or install a JAX "
                "version that the project's CI tests (README), and report the JAX version",
            )
    return None


if DUAL is not None:

    class _ProbeSin(_Hi):
        """sin as a `rules_call`: what `check_footing` differentiates."""

        lowered = None

        def label(self) -> str:
            return "footing check"

        def expand_flat(self, args):
            return [jnp.sin(args[0])]

        def jvp_flat(self, primals, tangents):
            return [jnp.sin(primals[0])], list(_ProbeCos(self.in_avals * 2, self.out_aval, ())(primals[0], tangents[0]))

        def linearize_flat(self, is_vjp, nzs, primals):
            cos = _ProbeCos(self.in_avals * 2, self.out_aval, ())
            return [jnp.sin(primals[0])], [True], list(primals), lambda res, t: list(cos(res[0], t))

    class _ProbeCos(_Hi):
        """Its tangent: cos(x) * t, linear in t."""

        lowered = None

        def label(self) -> str:
            return "footing check"

        def expand_flat(self, args):
            return [jnp.cos(args[0]) * args[1]]

        def transpose_flat(self, cts, args):
            return [None, jnp.cos(args[0]) * cts[0]]


def call(lowered: Any, dyn: list) -> Any:
    """`lowered`'s primitive applied to its dynamic inputs `dyn`, as one JAX primitive."""
    if not _footing or _footing[0] is not None:
        check_footing()
    dyn = [v if isinstance(v, jax.Array) else jnp.asarray(v) for v in dyn]
    in_avals = tuple(jax.typeof(v) for v in dyn)
    known = lowered.hi_out_types.get(in_avals)
    if known is None:
        if len(lowered.hi_out_types) >= _CACHE_SIZE:
            lowered.hi_out_types.clear()
        try:
            closed, shape = jax.make_jaxpr(lowered.primal, return_shape=True)(*dyn)
            known = lowered.hi_out_types[in_avals] = (tuple(closed.out_avals), jax.tree_util.tree_structure(shape))
        except VALUE_DEPENDENT as error:  # eager, and the type may depend on the values: not kept
            leaves, tree = jax.tree_util.tree_flatten(lowered.evaluated(dyn, error))
            known = (tuple(jax.typeof(leaf) for leaf in leaves), tree)
    out_avals, out_tree = known
    return jax.tree_util.tree_unflatten(out_tree, _RulesCall(lowered, in_avals, out_avals)(*dyn))
