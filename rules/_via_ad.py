"""`rrule_via_ad` / `frule_via_ad`: the registered rule if there is one, else JAX's AD.

Rules for higher-order functions (map, scan, fixed points) call these on the functions they
receive, in ChainRules' conventions whichever way the derivative is obtained.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._boundary import _tangent_leaves, conj_tree, rebuilt
from ._projection import is_differentiable_leaf
from ._registry import frule, rrule
from ._tangent import Tangent
from ._thunks import unthunk
from ._zeros import AbstractZero, NoTangent, ZeroTangent

__all__ = ["rrule_via_ad", "frule_via_ad"]


def _split(args: tuple) -> tuple[list, list]:
    """Leaves of args, and which ones JAX can differentiate."""
    leaves, _ = jax.tree_util.tree_flatten(args)
    return leaves, [is_differentiable_leaf(leaf) for leaf in leaves]


def _dense(t: Any, like: Any) -> Any:
    """A tangent as a pytree of arrays shaped like `like` (zeros for symbolic zeros)."""
    t = unthunk(t)
    if isinstance(t, AbstractZero):
        return jax.tree_util.tree_map(jnp.zeros_like, like)
    if isinstance(t, Tangent):
        leaves, tree = jax.tree_util.tree_flatten(like)
        parts = _tangent_leaves(t, like, [True] * len(leaves), "rrule_via_ad", "output", ())
        return jax.tree_util.tree_unflatten(
            tree, [jnp.zeros_like(l) if p is None or isinstance(p, AbstractZero) else p for l, p in zip(leaves, parts)]
        )
    return jax.tree_util.tree_map(  # result_type: like may hold Python scalars (jax.vjp of a custom_jvp gives them)
        lambda ti, li: jnp.zeros_like(li) if isinstance(unthunk(ti), AbstractZero)
        else jnp.asarray(unthunk(ti), jnp.result_type(li)),
        t,
        like,
        is_leaf=lambda x: isinstance(x, AbstractZero),
    )


def rrule_via_ad(f: Any, *args: Any, **kwargs: Any):
    """`(y, pullback)` for `f(*args)`: its registered rrule, else JAX's `jax.vjp`.

    The pullback follows ChainRules' conventions either way: `(f_bar, x1_bar, ...)`,
    `NoTangent()` for arguments JAX cannot differentiate, and the ChainRules complex
    convention (the conjugate of JAX's cotangent).

    >>> import jax.numpy as jnp
    >>> import rules
    >>> y, back = rules.rrule_via_ad(lambda x, n: jnp.sum(x ** n), jnp.array([1.0, 2.0]), 3)
    >>> back(1.0)
    (NoTangent(), Array([ 3., 12.], dtype=float64), NoTangent())

    See also: `rrule`, `frule_via_ad`.
    """
    result = rrule(f, *args, **kwargs)
    if result is not None:
        return result
    leaves, diff = _split(args)
    treedef = jax.tree_util.tree_structure(args)
    diff_leaves = [leaf for leaf, d in zip(leaves, diff) if d]

    def f_of_diff(*dl):
        return f(*rebuilt(treedef, leaves, [k for k, d in enumerate(diff) if d], dl), **kwargs)

    y, vjp_fn = jax.vjp(f_of_diff, *diff_leaves)

    def via_ad_pullback(y_bar):
        g = conj_tree(_dense(y_bar, y))
        cts = iter(conj_tree(vjp_fn(g)))
        out = [next(cts) if d else NoTangent() for d in diff]
        per_arg = jax.tree_util.tree_unflatten(treedef, out)
        return (NoTangent(), *(_collapse(a) for a in per_arg))

    return y, via_ad_pullback


def _collapse(t: Any) -> Any:
    """An argument's cotangent: NoTangent() when none of its leaves is differentiable."""
    leaves = jax.tree_util.tree_leaves(t, is_leaf=lambda x: isinstance(x, AbstractZero))
    return NoTangent() if all(isinstance(l, NoTangent) for l in leaves) else t


def frule_via_ad(tangents: tuple, f: Any, *args: Any, **kwargs: Any):
    """`(y, y_dot)` for `f(*args)`: its registered frule, else JAX's `jax.jvp`.

    >>> import rules
    >>> rules.frule_via_ad((rules.NoTangent(), 1.0), lambda x: x ** 3, 2.0)
    (Array(8., dtype=float64, weak_type=True), Array(12., dtype=float64, weak_type=True))

    See also: `frule`, `rrule_via_ad`.
    """
    result = frule(tangents, f, *args, **kwargs)
    if result is not None:
        return result
    leaves, diff = _split(args)
    treedef = jax.tree_util.tree_structure(args)
    t_args = tangents[1:]
    t_leaves = []
    for arg, t in zip(args, t_args):
        arg_leaves = jax.tree_util.tree_leaves(arg)
        t = unthunk(t)
        if isinstance(t, AbstractZero):
            t_leaves += [ZeroTangent()] * len(arg_leaves)
        else:
            t_leaves += jax.tree_util.tree_leaves(_dense(t, arg) if isinstance(t, Tangent) else t,
                                                  is_leaf=lambda x: isinstance(x, AbstractZero))
    diff_leaves = [leaf for leaf, d in zip(leaves, diff) if d]
    diff_tangents = [
        jnp.zeros_like(jnp.asarray(leaf)) if isinstance(t, AbstractZero) else jnp.asarray(t, jnp.result_type(leaf))
        for leaf, t, d in zip(leaves, t_leaves, diff)
        if d
    ]

    def f_of_diff(*dl):
        return f(*rebuilt(treedef, leaves, [k for k, d in enumerate(diff) if d], dl), **kwargs)

    return jax.jvp(f_of_diff, tuple(diff_leaves), tuple(diff_tangents))
