"""The one place where arguments are converted to JAX, and gradients back to Zygote's form.

The rule, for every leaf of every positional argument (arguments are JAX pytrees):

* inexact arrays (float, complex; NumPy or JAX, tracers included) and Python or NumPy
  floats/complex numbers are differentiated;
* Python ints (and NumPy integer scalars) are differentiated as reals, as Zygote does
  (`gradient(lambda x: 3*x**2, 5) == (30.0,)`). JAX differentiates floats only, so this
  takes a second pass: `f` first runs on the arguments as they are, which gives its own
  value and the gradients of the other leaves (an int exponent stays JAX's `integer_pow`,
  whose derivative at 0 is finite where `pow`'s is NaN; an int output stays an int); then
  `promoted_pass` runs it again with the ints promoted to floats and differentiated, the
  other leaves held, for the ints' own gradients. `f` therefore runs twice when an
  argument holds an int. If that pass fails because an int was needed concretely (a
  `TypeError`, which covers JAX's concretization and integer-conversion errors, an
  `IndexError`: an index, a shape, a `range`, or a `ValueError`: `jnp.take`'s index), the
  ints get `None`. (Eagerly, a promoted int is concrete, so a Python `if n > 2` on it works
  and its gradient is 0; under `jax.jit` the same branch fails, and the gradient is
  `None`.) The promoted pass comes second so that where a promoted int reaches one of
  JAX's caches keyed by a static value (`jnp.repeat`'s shape; 2.0 == 2), the int's entry
  is already there: the other order left the float's, which failed every later call with
  the int, the user's own too;
* everything else (bools, int/bool arrays, strings, None, callables, other objects) is
  passed as it is and gets `None`.

Gradients come back in the argument's structure, as arrays of the argument's dtype (never
weakly typed, also for Python numbers): a leaf that is not differentiated gets
`None` (Zygote's `nothing`), an argument without any differentiated leaf gets `None` as a
whole. Complex gradients are conjugated into ChainRules' convention (for a real loss `l`,
the gradient of `z` is dl/dRe z + i dl/dIm z), which is the conjugate of JAX's.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import jax
import numpy as np

import rules
from rules._boundary import conj, is_differentiable_leaf, rebuilt

from ._errors import GradientError

__all__ = ["ArgSpec", "promoted_pass", "to_zygote", "is_diff_leaf"]

T = TypeVar("T")
DIFF, INT, PASS = 0, 1, 2
_RETRY_ERRORS = (TypeError, IndexError, ValueError)


def _leaf_kind(leaf: Any) -> int:
    if isinstance(leaf, (bool, np.bool_)):
        return PASS
    if isinstance(leaf, (int, np.integer)):
        return INT
    return DIFF if is_differentiable_leaf(leaf) else PASS  # the rule system's: inexact arrays, floats


def is_diff_leaf(leaf: Any) -> bool:
    """Whether a leaf is differentiated (arrays, floats, ints as reals)."""
    return _leaf_kind(leaf) != PASS


def to_zygote(g: Any) -> Any:
    """A gradient leaf from JAX in Zygote's form: ChainRules' complex convention, not weakly typed.

    (JAX types the gradient of a Python number weakly; a gradient is data, so it gets the
    plain dtype, as `rules.ProjectTo` gives it.)
    """
    g = conj(g)
    return jax.lax.convert_element_type(g, g.dtype)


class ArgSpec:
    """Positional arguments split into the leaves JAX differentiates and the rest.

    `diff_index` holds the positions of the inexact leaves, `int_index` those of the ints;
    `values(index)` are the leaves there as handed to JAX (ints promoted to floats);
    `bind(f, index)` is `f` as a function of those leaves, every other leaf as given;
    `grads(found)` puts JAX's gradients, keyed by position, back into the arguments'
    structure (ChainRules' complex convention, `None` elsewhere).
    """

    def __init__(self, args: tuple):
        self.args = args
        self.leaves, self.treedef = jax.tree_util.tree_flatten(args)
        self.kinds = [_leaf_kind(leaf) for leaf in self.leaves]
        self.diff_index = [i for i, k in enumerate(self.kinds) if k == DIFF]
        self.int_index = [i for i, k in enumerate(self.kinds) if k == INT]
        counts = [t.num_leaves for t in self.treedef.children()]
        self.arg_ranges = list(zip(np.cumsum([0] + counts[:-1]).tolist(), np.cumsum(counts).tolist()))

    def values(self, index: list[int]) -> list:
        return [float(self.leaves[i]) if self.kinds[i] == INT else self.leaves[i] for i in index]

    def bind(self, f: Callable, index: list[int]) -> Callable:
        def f_of_leaves(*values):
            return f(*rebuilt(self.treedef, self.leaves, index, values))

        return f_of_leaves

    def grads(self, found: dict[int, Any]) -> tuple:
        """One entry per argument, from JAX's gradients of the leaves at the positions in `found`."""
        leaves: list[Any] = [None] * len(self.leaves)
        for i, g in found.items():
            leaves[i] = jax.tree_util.tree_map(to_zygote, g)
        out: list[Any] = []
        for (lo, hi), sub in zip(self.arg_ranges, self.treedef.children()):
            if any(i in found for i in range(lo, hi)):
                out.append(jax.tree_util.tree_unflatten(sub, leaves[lo:hi]))
            else:
                out.append(None)
        return tuple(out)


def promoted_pass(spec: ArgSpec, run: Callable[[list[int]], T]) -> T | None:
    """`run(spec.int_index)`, for the ints' gradients; `None` if there is no int or one was needed concretely.

    `run` binds `f` to the leaves at the index it gets, which `spec.values` promotes.
    Errors of the rule system and of `zygote_jax` itself are never taken for that.
    """
    if not spec.int_index:
        return None
    try:
        return run(spec.int_index)
    except _RETRY_ERRORS as err:
        if isinstance(err, (rules.RuleError, GradientError)):
            raise
    return None
