"""Dual-mode lowering: a primitive with an rrule becomes one JAX primitive that keeps its rules.

`jax.custom_vjp` cannot serve forward mode, and a choice made when the primitive is called
(frule under `jax.jvp`, rrule otherwise) is frozen into any jaxpr traced before the
differentiation: `jax.jvp(jax.jit(f))`, `jax.linearize`, a `scan` body. Here the primitive
is staged as a JAX primitive of ours, `rules_call`, which JAX asks, at each transformation,
for the rule it needs:

* a linearization *for a VJP* (`jax.vjp`, `jax.grad`; JAX passes `is_vjp` to a primitive's
  linearization rule): the rrule's forward pass now, and as the linear part a `rules_vjp`
  primitive whose transpose is the pullback;
* `jax.jvp` / `jax.jacfwd`, and `jax.linearize` (a linearization not for a VJP): the output
  tangent is a `_Pushforward`, linear in the tangents, which evaluates the frule (or, for an
  rrule alone, the transposed pullback) and transposes by the rrule. So reverse mode
  through a forward-mode trace (`jax.checkpoint` differentiates by JVP and transposition)
  still runs the rrule;
* `jax.vmap`: `_Batched`, the same protocol with every function vmapped;
* evaluation and compilation: the function itself (`mlir.lower_fun`).

The rules themselves, and every conversion between ChainRules' tangents and JAX's, stay in
`_lowering._Lowered`; this module only routes. A primitive's linearization rule
(`primitive_linearizations`) and fancy batching rule are JAX internals (`jax._src`), the
same that JAX's experimental hijax primitives use: `AVAILABLE` checks for them, and without
them the lowering falls back to `jax.custom_vjp` / `jax.custom_jvp` (the mode then chosen
when the primitive is called; docs/design.md says what that loses). Hijax primitives
themselves (`jax.experimental.hijax`) were measured and not used: jax.jit re-traces a
function holding one on every call (86 us instead of 4 us for a small one, in jax 0.10.2).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Any, Iterator

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from ._errors import ForwardModeError

__all__ = ["AVAILABLE", "ENABLED", "call", "forward_mode_required"]

try:  # pragma: no branch - which branch runs depends on the installed JAX
    import inspect

    from jax._src import core as _core
    from jax._src.interpreters import ad as _ad
    from jax._src.interpreters import batching as _batching
    from jax.extend.core import Primitive as _Primitive
    from jax.interpreters import mlir as _mlir

    AVAILABLE = (
        tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10)
        and hasattr(_ad, "primitive_linearizations")  # JAX asks a primitive to linearize itself,
        and "is_vjp" in inspect.signature(_ad.LinearizeTrace.__init__).parameters  # saying for what
        and hasattr(_batching, "fancy_primitive_batchers")
        and hasattr(_batching, "infer")
        and hasattr(_core, "unmapped_aval")
        and hasattr(_core, "mapped_aval")
    )
except (ImportError, AttributeError):  # pragma: no cover - an older or renamed JAX
    AVAILABLE = False

# `ZYGOTE_JAX_LOWERING=custom_vjp` forces the fallback (to compare, or to work around a JAX bug).
ENABLED = AVAILABLE and os.environ.get("ZYGOTE_JAX_LOWERING", "dual") != "custom_vjp"
_CACHE_SIZE = 512  # signatures remembered per lowering (output types, forward-mode verdicts)

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


def _is_zero(x: Any) -> bool:
    return isinstance(x, (_Zero, SymbolicZero))


def _tangent_aval(aval: Any) -> Any:
    return aval.to_tangent_aval()


def _inexact(aval: Any) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


class _Primal:
    """The (value, perturbed) pair that `_Lowered.fwd` reads (as jax.custom_vjp's own)."""

    __slots__ = ("value", "perturbed")

    def __init__(self, value: Any, perturbed: bool):
        self.value, self.perturbed = value, perturbed


if AVAILABLE:
    _Zero = _ad.Zero

    class _Hi:
        """An operation of the dual-mode lowering, as the parameter `_prim` of `rules_call_p`.

        Subclasses implement, on flat lists of arrays: `expand_flat` (evaluation), `jvp_flat`,
        `fwd_flat` / `bwd_flat` (a linearization for a VJP and its transpose), `lin_flat` /
        `linearized_flat` (any other linearization) and, when linear in some inputs,
        `transpose_flat`. A zero tangent or cotangent is JAX's `Zero`; a cotangent that is
        not there is None.
        """

        def __init__(self, in_avals, out_avals, key: tuple):
            self.in_avals, self.out_aval = tuple(in_avals), tuple(out_avals)
            self._key = (type(self).__name__, key, self.in_avals, self.out_aval)
            self._hash = hash(self._key)

        def __call__(self, *args):
            return rules_call_p.bind(*args, _prim=self)

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

        def __rules_program_key__(self) -> tuple:
            """What tells two of these apart beyond the printed jaxpr (rules.testing's reuse):
            the lowering (`_RulesCall`, `_Pushforward`), its rules and the function."""
            lowered = self.lowered  # type: ignore[attr-defined]
            return (lowered, lowered.rr, lowered.fr, lowered.prim.fn)

        def __rules_expansion__(self) -> Any:
            """The jaxpr this stands for (its text and callables key rules.testing's reuse)."""
            specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in self.in_avals]
            return jax.make_jaxpr(lambda *a: self.expand_flat(list(a)))(*specs)

    class _RulesCall(_Hi):
        """A primitive at one signature: the function, its rrule and its frule (if any)."""

        def __init__(self, lowered, in_avals, out_avals):
            self.lowered = lowered
            super().__init__(in_avals, out_avals, (lowered,))

        def label(self) -> str:
            return self.lowered.name

        def expand_flat(self, args):
            return jax.tree_util.tree_leaves(self.lowered.primal(*args))

        def fwd_flat(self, nzs, args):
            y, residual = self.lowered.fwd(*[_Primal(v, p) for v, p in zip(args, nzs)])
            return jax.tree_util.tree_leaves(y), residual

        def bwd_flat(self, res, cts):
            return _pullback(self.lowered, res, self.out_aval, cts)

        def jvp_flat(self, primals, tangents):
            return list(self(*primals)), self.pushforward(primals, tangents)

        def lin_flat(self, nzs, args):
            return list(self(*args)), tuple(args)

        def linearized_flat(self, res, tangents):
            return self.pushforward(list(res), tangents)

        def pushforward(self, primals, tangents) -> list:
            """The output tangents: a `_Pushforward` of the moved inputs (zeros if none)."""
            moved = tuple(i for i, t in enumerate(tangents) if not _is_zero(t) and _inexact(jax.typeof(t)))
            out = [_Zero(_tangent_aval(a)) for a in self.out_aval]
            diff = [i for i, a in enumerate(self.out_aval) if _inexact(a)]
            if not moved or not diff:
                return out
            push = _Pushforward(self.lowered, moved, self.in_avals, [_tangent_aval(self.out_aval[i]) for i in diff])
            if self.lowered.fr is None:  # the transposed pullback: can JAX transpose it?
                push = push.checked([*primals, *[tangents[i] for i in moved]])
            for i, t in zip(diff, push(*primals, *[tangents[i] for i in moved])):
                out[i] = t
            return out

    class _Pushforward(_Hi):
        """The output tangents of a `_RulesCall`: linear in the tangents of the `moved` inputs.

        Evaluated, it runs the frule (or transposes the pullback); transposed, the rrule.
        Inputs: the primitive's inputs, then the tangents of the moved ones.
        """

        def __init__(self, lowered, moved, primal_avals, out_avals, failure=None):
            self.lowered, self.moved, self.n = lowered, tuple(moved), len(primal_avals)
            self.failure = failure  # why it cannot be evaluated (a ForwardModeError), or None
            tangent_avals = [_tangent_aval(primal_avals[i]) for i in moved]
            super().__init__((*primal_avals, *tangent_avals), out_avals, (lowered, self.moved, failure))

        def checked(self, args: list) -> "_Pushforward":
            """This pushforward, or, if JAX cannot transpose the pullback, one that raises
            when evaluated (and at once under `forward_mode_required`). Cached per signature."""
            key = (self.moved, self.in_avals)
            known = self.lowered.hi_forward.get(key, False)
            if known is False:
                try:
                    jax.eval_shape(lambda *a: tuple(self.expand_flat(list(a))), *args)
                    known = None
                except ForwardModeError as err:
                    known = err
                if len(self.lowered.hi_forward) >= _CACHE_SIZE:
                    self.lowered.hi_forward.clear()
                self.lowered.hi_forward[key] = known
            if known is None:
                return self
            if _strict_forward.get():
                raise ForwardModeError(str(known)) from None
            return _Pushforward(self.lowered, self.moved, self.in_avals[: self.n], self.out_aval, failure=known)

        def label(self) -> str:
            return f"pushforward of {self.lowered.name}"

        def _tangents(self, ts) -> list:
            tangents: list[Any] = [SymbolicZero(_tangent_aval(a)) for a in self.in_avals[: self.n]]
            for i, t in zip(self.moved, ts):
                tangents[i] = t
            return tangents

        def expand_flat(self, args):
            if self.failure is not None:
                raise ForwardModeError(str(self.failure))
            primals, ts = args[: self.n], args[self.n :]
            rule = self.lowered.jvp if self.lowered.fr is not None else self.lowered.jvp_by_transpose
            y, y_dot = rule(list(primals), self._tangents(ts))
            leaves = jax.tree_util.tree_leaves(y_dot)
            return [leaves[i] for i, leaf in enumerate(jax.tree_util.tree_leaves(y)) if _inexact(jax.typeof(leaf))]

        def transpose_flat(self, cts, args):
            primals = args[: self.n]
            if any(p is None for p in primals):  # pragma: no cover - JAX keeps primals known
                raise NotImplementedError(f"{self!r} is linear only in its tangents")
            perturbed = [i in self.moved for i in range(self.n)]
            y, residual = self.lowered.fwd(*[_Primal(v, p) for v, p in zip(primals, perturbed)])
            y_avals = [jax.typeof(leaf) for leaf in jax.tree_util.tree_leaves(y)]
            x_bars = _pullback(self.lowered, residual, y_avals, _with_zeros(y_avals, cts))
            return [None] * self.n + [x_bars[i] for i in self.moved]

        # Derivatives of the pushforward itself (second order): JAX differentiates the rule.
        def _as_function(self):
            return lambda *args: tuple(self.expand_flat(list(args)))

        def jvp_flat(self, primals, tangents):
            dense = [_instantiate(t, a) for t, a in zip(tangents, self.in_avals)]
            out, out_dot = jax.jvp(self._as_function(), tuple(primals), tuple(dense))
            return list(out), list(out_dot)

        def fwd_flat(self, nzs, args):
            out, vjp_fn = jax.vjp(self._as_function(), *args)
            return list(out), vjp_fn

        def bwd_flat(self, res, cts):
            return list(res(tuple(_instantiate(ct, a) for ct, a in zip(cts, self.out_aval))))

        def lin_flat(self, nzs, args):
            return list(self(*args)), tuple(args)

        def linearized_flat(self, res, tangents):
            dense = [_instantiate(t, a) for t, a in zip(tangents, self.in_avals)]
            return list(jax.jvp(self._as_function(), tuple(res), tuple(dense))[1])

    class _Batched(_Hi):
        """`inner` under `jax.vmap`: each function of the protocol vmapped, batch axis 0.

        `dims[i]` is 0 for a batched input, None otherwise; every output is batched.
        Residuals keep the batch axes vmap gives them (`_Residuals`): one that does not
        depend on a batched input (a weight matrix under a vmap over examples) stays as it is.
        """

        def __init__(self, inner, dims, axis_data):
            self.inner, self.dims, self.axis_data = inner, tuple(dims), axis_data
            size, mesh_axis = axis_data.size, axis_data.explicit_mesh_axis
            in_avals = [a if d is None else _core.unmapped_aval(size, 0, a, mesh_axis) for a, d in zip(inner.in_avals, dims)]
            out_avals = [_core.unmapped_aval(size, 0, a, mesh_axis) for a in inner.out_aval]
            super().__init__(in_avals, out_avals, (inner, self.dims, axis_data))

        def label(self) -> str:
            return f"vmap of {self.inner.label()}"

        def __rules_program_key__(self) -> tuple:
            return self.inner.__rules_program_key__()

        def _vmap(self, fn, in_axes, out_axes: Any = 0):
            ad_ = self.axis_data
            return jax.vmap(
                fn, in_axes=in_axes, out_axes=out_axes, axis_size=ad_.size, axis_name=ad_.name,
                spmd_axis_name=ad_.spmd_name or ad_.explicit_mesh_axis,
            )

        def _with_residuals(self, fn, args):
            """`fn(*args) -> (outputs, residuals)` vmapped: outputs at axis 0, residuals where
            vmap puts them (`batching.infer`), their axes kept beside them."""
            (out, res), (_, axes) = self._vmap(fn, self.dims, (0, _batching.infer))(*args)
            return out, _Residuals(res, axes)

        def _unmap_zeros(self, values, avals):
            """Zeros come out of vmap with the inner aval: give them the batched one."""
            return [_Zero(_tangent_aval(a)) if _is_zero(v) else v for v, a in zip(values, avals)]

        def _inner_tangents(self, ts, nz):
            """Tangents for `inner`: the nonzero ones (vmapped) and zeros of its own avals."""
            it = iter(ts)
            return [next(it) if n else _Zero(_tangent_aval(a)) for n, a in zip(nz, self.inner.in_avals)]

        def _sum_unbatched(self, cts):
            return [ct if ct is None or d is not None else ct.sum(0) for ct, d in zip(cts, self.dims)]

        def expand_flat(self, args):
            return self._vmap(lambda *a: list(self.inner.expand_flat(list(a))), self.dims)(*args)

        def jvp_flat(self, primals, tangents):
            nz = [not _is_zero(t) for t in tangents]
            nz_dims = [d for d, n in zip(self.dims, nz) if n]

            def f(ps, ts):
                out, out_dot = self.inner.jvp_flat(list(ps), self._inner_tangents(ts, nz))
                return list(out), list(out_dot)

            out, out_dot = self._vmap(f, (list(self.dims), nz_dims))(primals, [t for t, n in zip(tangents, nz) if n])
            return out, self._unmap_zeros(out_dot, self.out_aval)

        def fwd_flat(self, nzs, args):
            return self._with_residuals(lambda *a: tuple(self.inner.fwd_flat(nzs, list(a))), args)

        def bwd_flat(self, res, cts):
            nz = [not _is_zero(ct) for ct in cts]

            def f(r, gs):
                it = iter(gs)
                full = [next(it) if n else _Zero(_tangent_aval(a)) for n, a in zip(nz, self.inner.out_aval)]
                return list(self.inner.bwd_flat(r, full))

            got = self._vmap(f, (res.axes, 0))(res.values, [ct for ct, n in zip(cts, nz) if n])
            return self._sum_unbatched(got)

        def lin_flat(self, nzs, args):
            return self._with_residuals(lambda *a: tuple(self.inner.lin_flat(nzs, list(a))), args)

        def linearized_flat(self, res, tangents):
            nz = [not _is_zero(t) for t in tangents]
            nz_dims = [d for d, n in zip(self.dims, nz) if n]

            def f(r, ts):
                return list(self.inner.linearized_flat(r, self._inner_tangents(ts, nz)))

            out = self._vmap(f, (res.axes, nz_dims))(res.values, [t for t, n in zip(tangents, nz) if n])
            return self._unmap_zeros(out, self.out_aval)

        def transpose_flat(self, cts, args):
            nz = [not _is_zero(ct) for ct in cts]
            known = [a is not None for a in args]

            def f(gs, vals):
                g_it, v_it = iter(gs), iter(vals)
                full_cts = [next(g_it) if n else _Zero(_tangent_aval(a)) for n, a in zip(nz, self.inner.out_aval)]
                full_args = [next(v_it) if k else None for k in known]
                return list(self.inner.transpose_flat(full_cts, full_args))

            known_dims = [d for d, k in zip(self.dims, known) if k]
            got = self._vmap(f, (0, known_dims))([ct for ct, n in zip(cts, nz) if n], [a for a in args if a is not None])
            return self._sum_unbatched(got)

    class _Residuals:
        """A batched operation's residuals and their batch axes (static: a pytree node's aux)."""

        def __init__(self, values: Any, axes: Any):
            self.values, self.axes = values, axes

    def _flatten_residuals(r: _Residuals):
        leaves, tree = jax.tree_util.tree_flatten(r.values)
        axes = tuple(jax.tree_util.tree_leaves(r.axes, is_leaf=lambda a: a is None))
        return leaves, (tree, axes)

    def _unflatten_residuals(aux, leaves) -> _Residuals:
        tree, axes = aux
        return _Residuals(jax.tree_util.tree_unflatten(tree, leaves), jax.tree_util.tree_unflatten(tree, list(axes)))

    jax.tree_util.register_pytree_node(_Residuals, _flatten_residuals, _unflatten_residuals)

    # ----- the two JAX primitives -------------------------------------------------------------
    # `rules_call`: any `_Hi` operation, which says how to evaluate, batch, differentiate and
    # transpose it. An ordinary (not "hijax") primitive, so jax.jit caches its traces and
    # dispatches compiled programs on its fast path.
    rules_call_p = _Primitive("rules_call")
    rules_call_p.multiple_results = True

    def _expand(*args, _prim):
        return list(_prim.expand_flat(list(args)))

    rules_call_p.def_impl(_expand)
    rules_call_p.def_abstract_eval(lambda *avals, _prim: list(_prim.out_aval))
    _mlir.register_lowering(rules_call_p, _mlir.lower_fun(_expand, multiple_results=True))

    def _call_jvp(primals, tangents, *, _prim):
        out, out_dot = _prim.jvp_flat(list(primals), list(tangents))
        return list(out), list(out_dot)

    def _call_transpose(cts, *args, _prim):
        return list(_prim.transpose_flat(list(cts), [None if _ad.is_undefined_primal(a) else a for a in args]))

    def _call_batch(axis_data, args, dims, *, _prim):
        return _prim.batch(axis_data, list(args), list(dims))

    def _call_linearize(is_vjp, nzs, *args, _prim):
        """JAX linearizes; `is_vjp` says whether only to transpose the result (jax.vjp, grad)."""
        nzs_out = [_inexact(a) for a in _prim.out_aval]
        if is_vjp:  # the rrule: its forward pass now, its pullback as the transpose
            out, res = _prim.fwd_flat(tuple(bool(n) for n in nzs), list(args))

            def linearized(res, *tangents):
                res_flat, res_tree = jax.tree_util.tree_flatten(res)
                nz_in = tuple(not _is_zero(t) for t in tangents)
                outs = iter(rules_vjp_p.bind(*res_flat, *[t for t in tangents if not _is_zero(t)],
                                             _prim=_prim, res_tree=res_tree, nz_in=nz_in))
                return [next(outs) if nz else _Zero(_tangent_aval(a)) for nz, a in zip(nzs_out, _prim.out_aval)]
        else:  # a linearization to evaluate: the pushforward
            out, res = _prim.lin_flat(tuple(bool(n) for n in nzs), list(args))

            def linearized(res, *tangents):
                got = _prim.linearized_flat(res, list(tangents))
                return [_instantiate(t, a) if nz else _Zero(_tangent_aval(a))
                        for t, nz, a in zip(got, nzs_out, _prim.out_aval)]

        return list(out), nzs_out, res, linearized

    rules_call_p_rules = (_call_jvp, _call_transpose, _call_batch, _call_linearize)
    _ad.primitive_jvps[rules_call_p] = _call_jvp
    _ad.primitive_transposes[rules_call_p] = _call_transpose
    _batching.fancy_primitive_batchers[rules_call_p] = _call_batch
    _ad.primitive_linearizations[rules_call_p] = _call_linearize

    # `rules_vjp`: the linear part of a linearization for a VJP. Only ever transposed (by the
    # pullback); JAX says so if it is evaluated, as it does for its own `custom_vjp`.
    rules_vjp_p = _Primitive("rules_vjp")
    rules_vjp_p.multiple_results = True

    @rules_vjp_p.def_abstract_eval
    def _vjp_abstract_eval(*avals, _prim, res_tree, nz_in):
        return [_tangent_aval(a) for a in _prim.out_aval if _inexact(a)]

    def _vjp_impl(*args, _prim, res_tree, nz_in):
        raise ForwardModeError(
            f"a linearization of `{_prim.label()}` made for reverse mode (jax.vjp, jax.grad) was "
            "evaluated forwards; use jax.jvp or jax.linearize for forward mode"
        )

    rules_vjp_p.def_impl(_vjp_impl)

    def _vjp_transpose(cts, *args, _prim, res_tree, nz_in):
        n_res = res_tree.num_leaves
        res = jax.tree_util.tree_unflatten(res_tree, args[:n_res])
        x_bars = _prim.bwd_flat(res, _with_zeros(_prim.out_aval, cts))
        return [None] * n_res + [ct for ct, nz in zip(x_bars, nz_in) if nz]

    _ad.primitive_transposes[rules_vjp_p] = _vjp_transpose

    def _with_zeros(out_avals, cts) -> list:
        """Cotangents of every output: `cts` for the inexact ones, in order, zeros for the rest."""
        it = iter(cts)
        return [next(it) if _inexact(a) else _Zero(_tangent_aval(a)) for a in out_avals]

    def _pullback(lowered, residual, out_avals, cts) -> list:
        """`lowered`'s pullback of JAX's output cotangents (zeros symbolic), one per input."""
        g = [SymbolicZero(_tangent_aval(a)) if _is_zero(ct) else ct for a, ct in zip(out_avals, cts)]
        return list(lowered.bwd(residual, g))

    def _instantiate(t: Any, aval: Any) -> Any:
        if not _is_zero(t):
            return t
        tangent = _tangent_aval(aval)
        return jnp.zeros(tangent.shape, tangent.dtype)


def call(lowered: Any, dyn: list) -> Any:
    """`lowered`'s primitive applied to its dynamic inputs `dyn`, as one JAX primitive."""
    dyn = [v if isinstance(v, jax.Array) else jnp.asarray(v) for v in dyn]
    in_avals = tuple(jax.typeof(v) for v in dyn)
    known = lowered.hi_out_types.get(in_avals)
    if known is None:
        if len(lowered.hi_out_types) >= _CACHE_SIZE:
            lowered.hi_out_types.clear()
        closed, shape = jax.make_jaxpr(lowered.primal, return_shape=True)(*dyn)
        known = lowered.hi_out_types[in_avals] = (tuple(closed.out_avals), jax.tree_util.tree_structure(shape))
    out_avals, out_tree = known
    return jax.tree_util.tree_unflatten(out_tree, _RulesCall(lowered, in_avals, out_avals)(*dyn))
