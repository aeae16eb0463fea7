"""The conventions that differ between ChainRules and JAX, each switched in one place.

Complex numbers: for a real loss l of a complex z, ChainRules' cotangent (the one every
pullback and every `zygote_jax` gradient holds) is dl/dRe z + i dl/dIm z, and JAX's the
conjugate. A cotangent crossing from one side to the other is conjugated by `conj`, the same
function both ways; tangents are the same on both sides.

Leaves: which pytree leaves are differentiated is `is_differentiable_leaf` (inexact arrays,
Python floats and complex numbers), and `leaf_kind` sorts a primitive's argument leaves by
it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ._projection import ArrayTypes, is_differentiable_leaf

__all__ = ["conj", "conj_tree", "leaf_kind", "is_differentiable_leaf", "DIFF", "NONDIFF", "STATIC"]

# a primitive argument leaf is differentiated, dynamic but not differentiated (int and bool
# arrays; any array given as a keyword) or static (part of the lowering's cache key)
DIFF, NONDIFF, STATIC = 0, 1, 2


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
