"""The one place where arguments are converted to JAX, and gradients back to Zygote's form.

The rule, for every leaf of every positional argument (arguments are JAX pytrees):

* inexact arrays (float, complex; NumPy or JAX, tracers included) and Python or NumPy
  floats/complex numbers are differentiated;
* Python ints (and NumPy integer scalars) are first *promoted* to floats and differentiated
  as reals, as Zygote does (`gradient(lambda x: 3*x**2, 5) == (30.0,)`); if tracing then
  fails because an int was needed concretely (a `TypeError`, which covers JAX's
  concretization and integer-conversion errors, an `IndexError`: an index, a shape, a
  `range`, or a `ValueError`: `jnp.take`'s index), the function is traced once more with
  *all* Python ints left as they are, and their gradients are `None`. The function
  therefore runs twice in that case. (Eagerly, a promoted int is concrete, so a Python
  `if n > 2` on it works and its gradient is 0; under `jax.jit` the same branch needs the
  retry, and the gradient is `None`);
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

__all__ = ["ArgSpec", "with_int_retry", "to_zygote", "is_diff_leaf"]

T = TypeVar("T")
DIFF, PROMOTED, PASS = 0, 1, 2
_RETRY_ERRORS = (TypeError, IndexError, ValueError)


def _leaf_kind(leaf: Any, ints_static: bool) -> int:
    if isinstance(leaf, (bool, np.bool_)):
        return PASS
    if isinstance(leaf, (int, np.integer)):
        return PASS if ints_static else PROMOTED
    return DIFF if is_differentiable_leaf(leaf) else PASS  # the rule system's: inexact arrays, floats


def is_diff_leaf(leaf: Any) -> bool:
    """Whether a leaf is differentiated when ints are promoted (arrays, floats, ints)."""
    return _leaf_kind(leaf, ints_static=False) != PASS


def to_zygote(g: Any) -> Any:
    """A gradient leaf from JAX in Zygote's form: ChainRules' complex convention, not weakly typed.

    (JAX types the gradient of a Python number weakly; a gradient is data, so it gets the
    plain dtype, as `rules.ProjectTo` gives it.)
    """
    g = conj(g)
    return jax.lax.convert_element_type(g, g.dtype)


class ArgSpec:
    """Positional arguments split into the leaves JAX differentiates and the rest.

    `diff_values` are the values handed to `jax.vjp` (promoted ints as floats); `bind(f)`
    is `f` as a function of those values; `grads(diff_grads)` puts JAX's gradients back
    into the arguments' structure (ChainRules' complex convention, `None` elsewhere).
    """

    def __init__(self, args: tuple, ints_static: bool):
        self.args = args
        self.leaves, self.treedef = jax.tree_util.tree_flatten(args)
        self.kinds = [_leaf_kind(leaf, ints_static) for leaf in self.leaves]
        self.promoted = PROMOTED in self.kinds
        self.diff_index = [i for i, k in enumerate(self.kinds) if k != PASS]
        self.diff_values = [
            float(self.leaves[i]) if self.kinds[i] == PROMOTED else self.leaves[i] for i in self.diff_index
        ]
        counts = [t.num_leaves for t in self.treedef.children()]
        self.arg_ranges = list(zip(np.cumsum([0] + counts[:-1]).tolist(), np.cumsum(counts).tolist()))

    def rebuild(self, diff_values: Any) -> tuple:
        return rebuilt(self.treedef, self.leaves, self.diff_index, diff_values)

    def bind(self, f: Callable) -> Callable:
        def f_of_diff_leaves(*diff_values):
            return f(*self.rebuild(diff_values))

        return f_of_diff_leaves

    def grads(self, diff_grads: Any) -> tuple:
        """One entry per argument, from one gradient per differentiated leaf (JAX's convention)."""
        leaves: list[Any] = [None] * len(self.leaves)
        for i, g in zip(self.diff_index, diff_grads):
            leaves[i] = jax.tree_util.tree_map(to_zygote, g)
        out: list[Any] = []
        for (lo, hi), sub in zip(self.arg_ranges, self.treedef.children()):
            if all(self.kinds[i] == PASS for i in range(lo, hi)):
                out.append(None)
            else:
                out.append(jax.tree_util.tree_unflatten(sub, leaves[lo:hi]))
        return tuple(out)


def with_int_retry(args: tuple, run: Callable[[ArgSpec], T]) -> T:
    """`run(spec)` with Python ints promoted to floats; if an int was needed concretely, again without.

    Errors of the rule system and of `zygote_jax` itself are never retried.
    """
    spec = ArgSpec(args, ints_static=False)
    if not spec.promoted:
        return run(spec)
    try:
        return run(spec)
    except _RETRY_ERRORS as err:
        if isinstance(err, (rules.RuleError, GradientError)):
            raise
    return run(ArgSpec(args, ints_static=True))
