"""The boundary between ChainRules' conventions and JAX's: every conversion of a tangent or
cotangent, one way or the other, is here (the lowering, `rules/_lowering.py`, only runs rules).

From JAX (`pullback_seed`, `frule_tangents`): JAX's symbolic zeros become `ZeroTangent()`,
positions that cannot be differentiated `NoTangent()`, cotangents are conjugated. To JAX
(`to_jax_cotangents`, `to_jax_tangent`, `zero_tangent_of`): a pullback's arity and f_bar
are checked, thunks are evaluated only for perturbed inputs, `Tangent`s become the primal's
pytree (`_tangent_leaves`), every leaf is projected onto its primal's dtype and shape (JAX
checks neither), cotangents are conjugated, zeros become None or JAX's symbolic zeros (with
`shard_map`'s varying axes).

Complex numbers: for a real loss l of a complex z, ChainRules' cotangent (the one every
pullback and every `zygote_jax` gradient holds) is dl/dRe z + i dl/dIm z, and JAX's the
conjugate. A cotangent crossing from one side to the other is conjugated by `conj`, the same
function both ways; tangents are the same on both sides.

Leaves: which pytree leaves are differentiated is `is_differentiable_leaf` (inexact arrays,
Python floats and complex numbers), and `leaf_kind` sorts a primitive's argument leaves by
it; `filled` / `rebuilt` put the part that varies back among the rest.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from ._errors import PullbackError, TangentStructureError, describe_argument, format_message, naming
from ._jax_compat import DUAL
from ._jax_compat import pcast_varying as _pcast_varying
from ._jax_compat import varying_axes as _varying_axes
from ._notimplemented import NotImplementedTangent
from ._projection import ArrayTypes, is_differentiable_leaf, project_leaf
from ._tangent import Tangent, children_with_names
from ._thunks import unthunk
from ._zeros import AbstractZero, NoTangent, ZeroTangent

__all__ = [
    "conj", "conj_tree", "leaf_kind", "is_differentiable_leaf", "is_jax_zero", "filled", "rebuilt",
    "pullback_seed", "frule_tangents", "to_jax_cotangents", "check_f_bar", "to_jax_tangent", "zero_tangent_of",
    "DIFF", "NONDIFF", "STATIC",
]

# a primitive argument leaf is differentiated, dynamic but not differentiated (int and bool
# arrays; any array given as a keyword) or static (part of the lowering's cache key)
DIFF, NONDIFF, STATIC = 0, 1, 2


_JAX_ZEROS: tuple = (SymbolicZero,) if DUAL is None else (SymbolicZero, DUAL.Zero)


def is_jax_zero(x: Any) -> bool:
    """Whether a cotangent or tangent is one of JAX's symbolic zeros (`SymbolicZero`, which a
    `jax.custom_vjp` gets, or the `Zero` JAX's own rules get): JAX's zero, at the edge."""
    return isinstance(x, _JAX_ZEROS)


def filled(leaves: Any, index: Any, values: Any) -> list:
    """A list of `leaves` with `values` at the positions `index`: the one rebuild of a pytree's leaves
    from the part that varies (the lowering's dynamic leaves, zygote_jax's differentiated
    ones, a compiled check's arrays) and the rest."""
    out = list(leaves)
    for k, v in zip(index, values):
        out[k] = v
    return out


def rebuilt(treedef: Any, leaves: Any, index: Any, values: Any) -> Any:
    """The pytree `treedef` of `filled(leaves, index, values)`."""
    return jax.tree_util.tree_unflatten(treedef, filled(leaves, index, values))


def conj(x: Any) -> Any:
    """A cotangent leaf in the other convention (ChainRules' <-> JAX's): conjugated if complex."""
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


def conj_tree(tree: Any) -> Any:
    """`conj` of every leaf of a pytree of cotangents."""
    return jax.tree_util.tree_map(conj, tree)


def leaf_kind(leaf: Any, keyword: bool = False) -> int:
    """DIFF, NONDIFF or STATIC for a leaf of a primitive's arguments (`keyword`: of a keyword
    argument, never differentiated: an array is dynamic, anything else static)."""
    if isinstance(leaf, ArrayTypes):
        return NONDIFF if keyword or not is_differentiable_leaf(leaf) else DIFF
    return DIFF if not keyword and is_differentiable_leaf(leaf) else STATIC


# ----- from JAX -------------------------------------------------------------------------------
def pullback_seed(y_leaves: list, y_tree: Any, out_diff: tuple, pattern: tuple, gs: Any) -> Any:
    """The pullback's input from JAX's cotangents `gs` of the output leaves in `pattern`: each
    conjugated into ChainRules' convention; `ZeroTangent()` for the other differentiable
    outputs (JAX's symbolic zeros), `NoTangent()` for the others."""
    y_bar_leaves: list[Any] = [NoTangent()] * len(y_leaves)
    for i in out_diff:
        y_bar_leaves[i] = ZeroTangent()
    for i, g in zip(pattern, gs):
        y_bar_leaves[i] = conj(g)
    return jax.tree_util.tree_unflatten(y_tree, y_bar_leaves)


def frule_tangents(sig: Any, tangents: Any) -> tuple:
    """An frule's `tangents` from JAX's: `NoTangent()` for the function itself, then one per
    positional argument of `sig` (a `_Lowered`): `ZeroTangent()` for an argument whose tangents
    are all JAX's symbolic zeros, `NoTangent()` for one with nothing to differentiate, else the
    argument's pytree of tangents."""
    leaf_tangents: list[Any] = [NoTangent()] * len(sig.kinds)
    for flat, t in zip(sig.dyn_index, tangents):
        if sig.kinds[flat] == DIFF:
            leaf_tangents[flat] = ZeroTangent() if isinstance(t, SymbolicZero) else t
    out = []
    for (lo, hi), sub in zip(sig.arg_ranges, sig.arg_treedefs):
        ts = leaf_tangents[lo:hi]
        if all(isinstance(t, AbstractZero) for t in ts):
            out.append(ZeroTangent() if any(sig.kinds[f] == DIFF for f in range(lo, hi)) else NoTangent())
        else:
            out.append(jax.tree_util.tree_unflatten(sub, ts))
    return (NoTangent(), *out)


# ----- to JAX ---------------------------------------------------------------------------------
def zero_tangent_of(leaf: Any) -> Any:
    """The zero tangent of an output leaf, with its varying mesh axes under `shard_map`."""
    shape, dtype = np.shape(leaf), jnp.result_type(leaf)
    if not jnp.issubdtype(dtype, jnp.inexact):
        if _varying_axes(leaf):  # float0 carries no varying axes: JAX makes the zero of the type
            return SymbolicZero(jax.typeof(leaf).to_tangent_aval())
        return np.zeros(shape, jax.dtypes.float0)
    zero = jnp.zeros(shape, dtype)
    axes = _varying_axes(leaf)
    return _pcast_varying(zero, axes) if axes else zero


def to_jax_cotangents(sig: Any, cotangents: Any, args: tuple, perturbed: list, metas: list) -> tuple:
    """A pullback's result in JAX's form, one entry per dynamic input of the signature `sig` (a
    `_Lowered`): its arity and f_bar checked, thunks of perturbed inputs only evaluated,
    `Tangent`s made leaves, each projected onto its primal and conjugated; None for zeros."""
    if not isinstance(cotangents, tuple):
        raise PullbackError(
            format_message(
                f"the pullback of `{sig.name}` must return a tuple (f_bar, x1_bar, ..., xn_bar)",
                expected=f"a tuple of {1 + sig.nargs} cotangents",
                got=f"{type(cotangents).__name__}",
                fix="return (NoTangent(), x_bar, ...): one entry for the function, then one per argument",
            )
        )
    if len(cotangents) != 1 + sig.nargs:
        raise PullbackError(
            format_message(
                f"the pullback of `{sig.name}` returned the wrong number of cotangents",
                expected=f"{1 + sig.nargs} (f_bar first, then one per positional argument)",
                got=f"{len(cotangents)}",
                fix="return (NoTangent(), x1_bar, ..., xn_bar); use NoTangent() for arguments "
                "that cannot be perturbed",
            )
        )
    check_f_bar(sig, cotangents[0])
    out: list[Any] = [None] * len(sig.dyn_index)
    for i, (lo, hi) in enumerate(sig.arg_ranges):
        want = [sig.kinds[f] == DIFF and perturbed[sig.dyn_pos[f]] for f in range(lo, hi)]
        if not any(want):
            continue  # never evaluate the thunk of an input that is not differentiated
        with naming(lambda i=i: f"(raised evaluating the cotangent of `{sig.name}`'s "
                     f"{describe_argument(i, fn=sig.prim)}: a thunk of its pullback)"):
            leaf_cts = _tangent_leaves(cotangents[1 + i], args[i], want, sig.name, i, (), sig.prim)
        for flat, ct in zip(range(lo, hi), leaf_cts):
            if ct is None or isinstance(ct, AbstractZero):
                continue
            d = sig.dyn_pos[flat]
            shape, dtype = metas[d]
            where = lambda i=i, k=flat - lo: (  # noqa: E731  (built only for an error)
                f"the pullback of `{sig.name}`, {describe_argument(i, _leaf_path(args[i], k), fn=sig.prim)}"
            )
            out[d] = conj(project_leaf(ct, dtype, shape, where))
    return tuple(out)


def check_f_bar(sig: Any, f_bar: Any) -> None:
    """The function's own cotangent (slot 0) must be zero: the lowering has no place for it."""
    if f_bar is None or isinstance(f_bar, AbstractZero):
        return
    with naming(f"(raised evaluating f_bar, the first item returned by the pullback of `{sig.name}`)"):
        f_bar = unthunk(f_bar)
    if f_bar is None or isinstance(f_bar, AbstractZero):
        return
    got = f"an array of shape {np.shape(f_bar)}" if isinstance(f_bar, ArrayTypes) else type(f_bar).__name__
    raise PullbackError(
        format_message(
            f"the pullback of `{sig.name}` returned a cotangent for the function itself (f_bar, "
            "the first item), which JAX would drop",
            expected=f"NoTangent() first, then one cotangent per argument: (NoTangent(), {sig._slots('_bar')})",
            got=got,
            fix="put NoTangent() first (is the order of the cotangents swapped?); to differentiate "
            "arrays the function closes over, pass them as arguments",
        )
    )


def to_jax_tangent(sig: Any, y_dot: Any, y: Any) -> Any:
    """An frule's output tangent in JAX's form: leaves projected onto the output's; a zero of an
    inexact leaf stays symbolic (JAX's `SymbolicZero`), so the next rule is not run on it."""
    y_leaves, y_tree = jax.tree_util.tree_flatten(y)
    leaf_ts = _tangent_leaves(y_dot, y, [True] * len(y_leaves), sig.name, "output", (), sig.prim)
    out = []
    for k, (leaf, t) in enumerate(zip(y_leaves, leaf_ts)):
        shape, dtype = np.shape(leaf), jnp.result_type(leaf)
        if (t is None or isinstance(t, AbstractZero)) and jnp.issubdtype(dtype, jnp.inexact):
            out.append(SymbolicZero(jax.typeof(leaf).to_tangent_aval()))  # stays symbolic for the next rule
        elif t is None or isinstance(t, AbstractZero) or not jnp.issubdtype(dtype, jnp.inexact):
            out.append(zero_tangent_of(leaf))
        else:
            where = lambda k=k: f"the frule of `{sig.name}`, {describe_argument('output', _leaf_path(y, k))}"  # noqa: E731
            out.append(project_leaf(t, dtype, shape, where))
    return jax.tree_util.tree_unflatten(y_tree, out)


def _path_text(path: tuple) -> str:
    return "".join(f".{p}" if isinstance(p, str) and p.isidentifier() else f"[{p!r}]" for p in path)


# ----- structural tangents -> leaves ----------------------------------------------------------
def _describe_tangent(ct: Any) -> str:
    return f"an array of shape {np.shape(ct)}" if isinstance(ct, ArrayTypes) else type(ct).__name__


def _tangent_template(primal: Any, names: list) -> str:
    """`Tangent(Linear, w=..., b=...)`: the tangent a rule returns for `primal`."""
    kind = type(primal).__name__
    if isinstance(primal, tuple) and not hasattr(primal, "_fields"):
        return f"Tangent(tuple, {', '.join('...' for _ in names)})"
    if isinstance(primal, dict):
        return f"Tangent(dict, {{{', '.join(f'{k!r}: ...' for k in names)}}})"
    if all(isinstance(k, str) and k.isidentifier() for k in names):
        return f"Tangent({kind}, {', '.join(f'{k}=...' for k in names)})"
    return f"Tangent({kind}, ...)"


def _leaf_path(tree: Any, k: int) -> str:
    paths = jax.tree_util.tree_flatten_with_path(tree)[0]
    return jax.tree_util.keystr(paths[k][0]) if len(paths) > 1 or paths[0][0] else ""


def _jax_children(primal: Any):
    """JAX's one-level split of a pytree node, or None for a leaf."""
    if jax.tree_util.all_leaves([primal]):
        return None
    return children_with_names(primal)


def _structure_error(what: str, name: str, index: Any, path: tuple, fn: Any, **sections: str) -> TangentStructureError:
    """A `TangentStructureError` about the tangent of argument `index` at `path`."""
    return TangentStructureError(format_message(
        what, argument=describe_argument(index, _path_text(path), fn=fn), **sections))


def _tangent_leaves(ct: Any, primal: Any, want: list[bool], name: str, index: Any, path: tuple, fn: Any = None) -> list:
    """The tangent `ct` of `primal`, as one entry per leaf of `primal` (None where not wanted)."""
    n = len(want)
    if not any(want):
        return [None] * n
    ct = unthunk(ct)
    if isinstance(ct, AbstractZero):
        return [None] * n
    if isinstance(ct, NotImplementedTangent):
        err = ct.error(f"as the cotangent of `{name}` {describe_argument(index, _path_text(path), fn=fn)}")
        raise err
    if primal is None:
        return []
    split = _jax_children(primal)
    if split is None:
        if isinstance(ct, Tangent) or not isinstance(ct, (*ArrayTypes, int, float, complex)):
            raise _structure_error(
                f"`{name}`: a rule returned a structured tangent for an array", name, index, path, fn,
                expected=f"an array of shape {np.shape(primal)}",
                got=f"{type(ct).__name__}",
                fix="return an array (or ZeroTangent()) for array arguments",
            )
        return [ct]
    pairs, _ = split
    names = [k for k, _ in pairs]
    if isinstance(ct, Tangent):
        lookup = dict(ct.items()) if isinstance(ct._backing, tuple) else dict(ct._backing)
    else:
        ct_split = _jax_children(ct) if type(ct) is type(primal) else None
        if ct_split is None or [k for k, _ in ct_split[0]] != names:
            raise _structure_error(
                f"`{name}`: the tangent's structure does not match the primal's", name, index, path, fn,
                expected=f"a Tangent or a {type(primal).__name__} with fields {names}",
                got=_describe_tangent(ct) + (f" with fields {[k for k, _ in ct_split[0]]}" if ct_split else ""),
                fix=f"return {_tangent_template(primal, names)}, one tangent per field (or ZeroTangent())",
            )
        lookup = dict(ct_split[0])
    unknown = [k for k in lookup if k not in names]
    if unknown:
        raise _structure_error(
            f"`{name}`: the Tangent has fields the primal lacks", name, index, path, fn,
            expected=f"fields among {names}",
            got=f"{list(lookup)}",
            fix=f"build the Tangent with the field names of {type(primal).__name__}",
        )
    out: list = []
    offset = 0
    for key, child in pairs:
        m = jax.tree_util.tree_structure(child).num_leaves
        out += _tangent_leaves(lookup.get(key, ZeroTangent()), child, want[offset : offset + m], name, index, (*path, key), fn)
        offset += m
    return out
