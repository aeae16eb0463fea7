"""Primitives: rule-aware functions that JAX differentiates through their rules."""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import RuleDefinitionError, format_message
from ._jax_compat import pcast_varying as _pcast_varying
from ._jax_compat import varying_axes as _varying_axes
from ._lowering import _Tracer, bypass_in_own_rule, call_lowered
from ._registry import frule, note_wrapped, register_examples, rrule

__all__ = ["Primitive", "primitive", "external", "unwrap"]


class Primitive:
    """A function whose rules (`rrule`/`frule`) JAX uses; made by `primitive` or `external`.

    Called with concrete arrays and no JAX transformation active, it calls the function
    directly. Under a transformation (`jit`, `grad`, `vmap`, ...) it goes through the
    lowering of its rules: an rrule (with or without an frule) -> one JAX primitive that keeps
    both (`rules._dual`; `jax.custom_vjp` on a JAX without it), frule only ->
    `jax.custom_jvp`, no rule -> the function itself (JAX differentiates it).

    See also: `primitive`, `external`, `rrule`.
    """

    # Set by `external` only (annotations, not class attributes: `getattr(prim, name, None)` stays None).
    vmap_method: str
    _fallback_frule: Callable

    def __init__(self, fn: Callable, *, name: str | None = None, examples: Iterable[tuple] | None = None):
        if not callable(fn):
            raise RuleDefinitionError(f"`primitive(fn)`: fn must be callable; got {type(fn).__name__}.")
        self.fn = fn
        self.__rules_key__ = getattr(fn, "__rules_key__", fn)
        note_wrapped(self.__rules_key__)
        functools.update_wrapper(self, fn, updated=())
        if name is not None:
            self.__name__ = self.__qualname__ = name
        self.name_in_messages = name  # None: the wrapped function's name
        self._lowered: dict = {}
        if examples is not None:
            register_examples(self, examples)

    def __repr__(self) -> str:
        return f"<primitive {getattr(self, '__qualname__', self.fn)!r}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        for leaf in leaves:
            if isinstance(leaf, _Tracer):
                if bypass_in_own_rule(self.__rules_key__, leaves):
                    break
                return call_lowered(self, args, kwargs, leaves, treedef)
        return self.fn(*args, **kwargs)

    def __get__(self, obj, objtype=None):
        # Used as a method: bind like a function would.
        return self if obj is None else functools.partial(self, obj)

    def rrule(self, impl: Callable | None = None, *, types: Iterable | None = None):
        """Register the rrule of this primitive: `@f.rrule` or `@f.rrule(types=(...))`."""
        return rrule.register(self, impl, types=types)

    def frule(self, impl: Callable | None = None, *, types: Iterable | None = None):
        """Register the frule of this primitive: `@f.frule` or `@f.frule(types=(...))`."""
        return frule.register(self, impl, types=types)

    @property
    def examples(self) -> list[tuple]:
        from ._registry import examples_of

        return examples_of(self)


def primitive(fn: Callable | None = None, *, examples: Iterable[tuple] | None = None, name: str | None = None):
    """Make `fn` a `Primitive`: a function whose registered rules JAX uses.

    Use as `@primitive`, as `@primitive(examples=[(x1,), (x2,)])` (argument tuples that
    `python -m rules check` verifies the rules on), or as `primitive(jnp.sinc)` for a
    function you do not own (its rules are registered on the wrapped function).

    >>> import jax, jax.numpy as jnp
    >>> import rules
    >>> @rules.primitive
    ... def square(x):
    ...     return x * x
    >>> @square.rrule
    ... def square_rrule(x):
    ...     def square_pullback(y_bar):
    ...         return rules.NoTangent(), 7 * 2 * x * y_bar   # deliberately 7x
    ...     return square(x), square_pullback
    >>> float(jax.grad(square)(3.0))   # the rule is used
    42.0
    >>> float(jax.jit(jax.grad(square))(3.0))
    42.0

    See also: `Primitive`, `external`, `rrule`, `frule`.
    """
    if fn is None:
        return lambda f: Primitive(f, examples=examples, name=name)
    return Primitive(fn, examples=examples, name=name)


def unwrap(f: Any) -> Callable:
    """The plain function behind a primitive (the function itself otherwise)."""
    return f.fn if isinstance(f, Primitive) else f


_VMAP_METHODS = ("sequential", "expand_dims", "broadcast_all", "legacy_vectorized")


def external(
    fn: Callable,
    result_shape_dtypes: Any,
    *,
    vmap_method: str | None = None,
    name: str | None = None,
    examples: Iterable[tuple] | None = None,
) -> Primitive:
    """A primitive whose primal runs outside JAX (NumPy, SciPy, C) through `jax.pure_callback`.

    Args:
      fn: called with NumPy arrays; returns arrays (cast to the declared dtypes).
      result_shape_dtypes: a pytree of `jax.ShapeDtypeStruct`, or a function of the
        arguments returning one.
      vmap_method: how `jax.vmap` batches the callback: "sequential" (one call per element,
        always correct), "expand_dims" or "broadcast_all" (fn is vectorised over a leading
        batch dimension), as in `jax.pure_callback`. By default, "expand_dims" for a NumPy
        ufunc (`np.sin`, `scipy.special.erfcx`: they broadcast, and one call per element is
        ~40x slower) and "sequential" for anything else.
      name, examples: as for `primitive`.

    Returns:
      A `Primitive`: give it rules with `@f.rrule` / `@f.frule` to make it differentiable.

    >>> import jax, jax.numpy as jnp, scipy.special
    >>> import rules
    >>> erfcx = rules.external(scipy.special.erfcx,
    ...                        lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)))
    >>> @erfcx.rrule
    ... def erfcx_rrule(x):
    ...     y = erfcx(x)
    ...     def erfcx_pullback(y_bar):   # d/dx erfcx(x) = 2 x erfcx(x) - 2/sqrt(pi)
    ...         return rules.NoTangent(), y_bar * (2 * x * y - 2 / jnp.sqrt(jnp.pi))
    ...     return y, erfcx_pullback
    >>> round(float(jax.grad(erfcx)(1.0)), 6)
    -0.273212

    See also: `primitive`, `jax.pure_callback`.
    """
    if vmap_method is None:
        vmap_method = "expand_dims" if isinstance(fn, np.ufunc) else "sequential"
    if vmap_method not in _VMAP_METHODS:
        raise ValueError(
            format_message(
                f"`external({getattr(fn, '__name__', fn)}, ...)`: unknown vmap_method",
                expected=" or ".join(repr(m) for m in _VMAP_METHODS),
                got=repr(vmap_method),
            )
        )
    fn_name = name if name else getattr(fn, "__name__", "external")  # not `or`: mypy would keep None

    def call(*args, **kwargs):
        shapes = result_shape_dtypes(*args, **kwargs) if callable(result_shape_dtypes) else result_shape_dtypes
        specs, tree = jax.tree_util.tree_flatten(shapes)
        eager = not any(isinstance(leaf, _Tracer) for leaf in jax.tree_util.tree_leaves((args, kwargs)))

        def host(*host_args):
            out = fn(*host_args, **kwargs)
            leaves = jax.tree_util.tree_leaves(out)
            if len(leaves) != len(specs):
                raise RuleDefinitionError(
                    format_message(
                        f"external `{fn_name}` returned the wrong number of arrays",
                        expected=f"{len(specs)} (from result_shape_dtypes)",
                        got=f"{len(leaves)}",
                    )
                )
            fixed = []
            for k, (leaf, spec) in enumerate(zip(leaves, specs)):
                arr = np.asarray(leaf)
                want = tuple(spec.shape)
                # under jax.vmap with "expand_dims"/"broadcast_all" the host sees batched arrays:
                # the declared shape is then a suffix of the result's shape
                if arr.shape[arr.ndim - len(want):] != want or arr.ndim < len(want):
                    raise RuleDefinitionError(
                        format_message(
                            f"external `{fn_name}` returned an array of the wrong shape (output leaf {k})",
                            expected=f"shape {tuple(spec.shape)} (from result_shape_dtypes)",
                            got=f"shape {arr.shape}",
                            fix="make result_shape_dtypes describe what fn returns",
                        )
                    )
                fixed.append(arr.astype(spec.dtype, copy=False))
            return jax.tree_util.tree_unflatten(tree, fixed)

        if eager:  # an eager pure_callback of a fresh closure would compile anew on every call
            host_args = jax.tree_util.tree_map(np.asarray, args)
            return jax.tree_util.tree_map(jnp.asarray, host(*host_args))
        out = jax.pure_callback(host, shapes, *args, vmap_method=vmap_method)
        return _varying_like(out, args)

    call.__name__ = call.__qualname__ = fn_name
    call.__doc__ = getattr(fn, "__doc__", None)
    call.__module__ = getattr(fn, "__module__", None) or __name__
    prim = Primitive(call, name=fn_name, examples=examples)
    prim.vmap_method = vmap_method

    def no_rule_frule(tangents, *args, **kwargs):
        raise RuleDefinitionError(
            format_message(
                f"`{fn_name}` is an `external` (its primal runs outside JAX, through `jax.pure_callback`) "
                "with no rule, so JAX cannot differentiate it",
                expected="an rrule or frule registered for it",
                got="no rule for these arguments",
                fix=f"define one with `@{fn_name}.rrule` (reverse mode) or `@{fn_name}.frule` (forward "
                "mode); see `rules.external`'s example",
            )
        )

    # Under a transformation with no rule, the lowering wraps the callback in a custom_jvp
    # whose rule is this error: jit and vmap still work, differentiation says what to do.
    prim._fallback_frule = no_rule_frule
    return prim


def _varying_like(out: Any, args: Any) -> Any:
    """Inside `shard_map`, a callback's outputs vary along the mesh axes its inputs vary along.

    JAX types a `pure_callback`'s outputs as invariant; its tangents, computed from the
    varying inputs by the rules, vary, and `check_vma=True` rejects the mismatch.
    """
    axes = sorted({a for leaf in jax.tree_util.tree_leaves(args) for a in _varying_axes(leaf)})
    if not axes:
        return out

    def widen(leaf):
        missing = tuple(a for a in axes if a not in _varying_axes(leaf))
        return _pcast_varying(leaf, missing) if missing else leaf

    return jax.tree_util.tree_map(widen, out)


_ = jnp  # jax.numpy is part of this module's namespace for doctests
