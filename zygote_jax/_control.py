"""Gradient control: `dropgrad`, `ignore_derivatives`, `hook`, `checkpointed`, `isderiving`, `Buffer`."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from rules import ignore_derivatives

from ._args import conj_tree
from ._errors import GradientError, message, name_of

__all__ = ["dropgrad", "ignore_derivatives", "hook", "checkpointed", "isderiving", "deriving", "Buffer"]


# ----- isderiving ------------------------------------------------------------------------------
_depth: contextvars.ContextVar[int] = contextvars.ContextVar("zygote_jax_deriving", default=0)


@contextlib.contextmanager
def deriving() -> Iterator[None]:
    """Mark the code run inside as being differentiated by `zygote_jax` (see `isderiving`)."""
    token = _depth.set(_depth.get() + 1)
    try:
        yield
    finally:
        _depth.reset(token)


def isderiving() -> bool:
    """Whether the code calling it is being differentiated by `zygote_jax` right now.

    True while `gradient`, `pullback`, `jacobian`, `hessian`, ... trace the function they
    differentiate; False otherwise, also under JAX's own `jax.grad`, which `zygote_jax`
    cannot see. The answer is fixed when the code is traced: a function compiled by
    `jax.jit` keeps the answer of the trace that compiled it.

    Returns:
      A bool.

    >>> import zygote_jax
    >>> def f(x):
    ...     return x * (2.0 if zygote_jax.isderiving() else 1.0)
    >>> f(3.0), float(zygote_jax.gradient(f, 3.0)[0])
    (3.0, 2.0)

    See also: `dropgrad`, `ignore_derivatives`.
    """
    return _depth.get() > 0


# ----- dropgrad --------------------------------------------------------------------------------
def dropgrad(x: Any) -> Any:
    """The value of `x`, with its derivative dropped (every array leaf of a pytree).

    Args:
      x: an array, a number, or a pytree of them.

    Returns:
      `x`, through `jax.lax.stop_gradient`: its gradient is zero.

    >>> import zygote_jax
    >>> zygote_jax.gradient(lambda a, b: zygote_jax.dropgrad(a) * b, 2.0, 3.0)
    (Array(0., dtype=float64), Array(2., dtype=float64))

    See also: `ignore_derivatives`, `jax.lax.stop_gradient`.
    """
    return jax.tree_util.tree_map(lambda leaf: jax.lax.stop_gradient(leaf) if isinstance(leaf, jax.Array) else leaf, x)


# ----- hook ------------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _hook(fn: Callable, x: Any) -> Any:
    return x


def _hook_fwd(fn, x):
    return x, None


def _hook_bwd(fn, _, g):
    out = conj_tree(fn(conj_tree(g)))  # `fn` sees ChainRules' convention, like every pullback

    def like(g_leaf, v):
        v = jnp.asarray(v)
        if v.shape != g_leaf.shape:
            raise GradientError(
                message(
                    f"`hook({name_of(fn)}, x)`: the hook changed the shape of the gradient",
                    expected=f"shape {g_leaf.shape}",
                    got=f"shape {v.shape}",
                    fix="return a gradient of the same shape as x",
                )
            )
        return v.astype(g_leaf.dtype)

    return (jax.tree_util.tree_map(like, g, out),)


_hook.defvjp(_hook_fwd, _hook_bwd)


def hook(fn: Callable[[Any], Any], x: Any) -> Any:
    """Identity on `x`; in the backward pass, `x`'s gradient is `fn(gradient)`.

    Use it to inspect (print, log, `jax.debug.print`) or change a gradient on its way back.

    Args:
      fn: a function of the cotangent reaching `x` (ChainRules' complex convention); it must
        return a cotangent of the same shape.
      x: an array, a number, or a pytree of them.

    Returns:
      `x` (as an array).

    Raises:
      GradientError: in the backward pass, if `fn` returns a gradient of another shape.

    >>> import zygote_jax
    >>> g = zygote_jax.gradient(lambda a, b: zygote_jax.hook(lambda g: -g, a) * b, 2.0, 3.0)
    >>> [float(v) for v in g]
    [-3.0, 2.0]

    See also: `dropgrad`, `jax.debug.print`.
    """
    return _hook(fn, x)


# ----- checkpointed ----------------------------------------------------------------------------
def checkpointed(f: Callable, *args: Any) -> Any:
    """`f(*args)`, recomputed in the backward pass instead of storing its intermediates.

    Gradient checkpointing (`jax.checkpoint`): the result and its gradient are those of
    `f(*args)`; memory is traded for a second forward pass. Array and float leaves of the
    arguments are the checkpoint's inputs; other leaves (ints, strings) are fixed.

    Args:
      f: the function to checkpoint.
      *args: its arguments.

    Returns:
      `f(*args)`.

    >>> import jax.numpy as jnp, zygote_jax
    >>> float(zygote_jax.gradient(lambda x: zygote_jax.checkpointed(jnp.sin, x), 0.0)[0])
    1.0

    See also: `jax.checkpoint`, `gradient`.
    """
    leaves, treedef = jax.tree_util.tree_flatten(args)
    dynamic = [isinstance(v, (jax.Array, np.ndarray, float, complex)) and not isinstance(v, bool) for v in leaves]

    def f_of_arrays(*values):
        it = iter(values)
        full = [next(it) if d else v for v, d in zip(leaves, dynamic)]
        return f(*jax.tree_util.tree_unflatten(treedef, full))

    return jax.checkpoint(f_of_arrays)(*[v for v, d in zip(leaves, dynamic) if d])


# ----- Buffer ----------------------------------------------------------------------------------
@jax.tree_util.register_pytree_node_class
class Buffer:
    """An array that looks mutable (`buf[i] = v`) and stays differentiable.

    Zygote's `Buffer`: code written with in-place writes runs under `gradient` and
    `jax.jit`, because each write is a functional update (`.at[i].set(v)`) of the array the
    buffer holds. `copy()` returns that array and freezes the buffer, as in Zygote.

    Args:
      x: the initial contents (an array or number), or, with `shape`, the template whose
        dtype a zero-filled buffer takes (Zygote's `Buffer(xs, dims...)`).
      *shape: the shape of a zero-filled buffer.

    Raises:
      GradientError: on a write after `copy()`.

    >>> import jax.numpy as jnp, zygote_jax
    >>> def vstack_with_buffer(xs):
    ...     buf = zygote_jax.Buffer(xs, len(xs), 2)
    ...     for i in range(len(xs)):
    ...         buf[i, :] = xs[i]
    ...     return buf.copy()
    >>> vstack_with_buffer(jnp.array([1.0, 2.0]))
    Array([[1., 1.],
           [2., 2.]], dtype=float64)
    >>> zygote_jax.gradient(lambda x: jnp.sum(vstack_with_buffer(x)), jnp.array([1.0, 2.0]))
    (Array([2., 2.], dtype=float64),)

    See also: `gradient`, `jax.numpy.ndarray.at`.
    """

    def __init__(self, x: Any, *shape: int):
        if shape:
            self._data = jnp.zeros(shape, jnp.result_type(x))
        else:
            self._data = jnp.asarray(x)
        self._frozen = False

    def tree_flatten(self):
        return (self._data,), self._frozen

    @classmethod
    def tree_unflatten(cls, frozen, children):
        buf = object.__new__(cls)
        buf._data, buf._frozen = children[0], frozen
        return buf

    def __getitem__(self, index: Any) -> jax.Array:
        return self._data[index]

    def __setitem__(self, index: Any, value: Any) -> None:
        if self._frozen:
            raise GradientError(
                message(
                    "`Buffer`: cannot write to a buffer after `copy()`",
                    expected="writes before `copy()`",
                    got=f"a write at index {index!r} after `copy()`",
                    fix="make a new Buffer from the copy: `Buffer(buf.copy())`",
                )
            )
        self._data = self._data.at[index].set(value)

    def copy(self) -> jax.Array:
        """The buffer's contents as an array; the buffer is frozen afterwards."""
        self._frozen = True
        return self._data

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def dtype(self) -> Any:
        return self._data.dtype

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        state = ", frozen" if self._frozen else ""
        return f"Buffer({self._data.dtype}[{','.join(map(str, self._data.shape))}]{state})"
