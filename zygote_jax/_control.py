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
from rules._boundary import conj_tree

from ._errors import GradientError, describe, message, name_of

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
    out = fn(conj_tree(g))  # `fn` sees ChainRules' convention, like every pullback
    return (conj_tree(_checked_hook_result(fn, g, out)),)


def _checked_hook_result(fn: Callable, g: Any, out: Any) -> Any:
    """`out` cast to `g`'s dtypes, once it has `g`'s structure and shapes and is real where `g` is."""
    what = f"`hook({name_of(fn)}, x)`"
    if out is None:
        raise GradientError(
            message(
                f"{what}: the hook returned None; it must return the gradient, changed or not",
                expected=f"a gradient like the one it received ({describe(g)})",
                got="None",
                fix="return the gradient after using it: `lambda g: (print(g), g)[1]`, or a function "
                "that calls `jax.debug.print(\"{}\", g)` and then returns `g`; to drop the gradient, "
                "return `jnp.zeros_like(g)`",
            )
        )
    paths_and_leaves, treedef = jax.tree_util.tree_flatten_with_path(g)
    if jax.tree_util.tree_structure(out) != treedef:
        raise GradientError(
            message(
                f"{what}: the hook changed the structure of the gradient",
                expected=str(treedef),
                got=str(jax.tree_util.tree_structure(out)),
                fix="return a gradient with the structure of x (same containers, keys and number of leaves)",
            )
        )
    leaves = []
    for (path, g_leaf), v in zip(paths_and_leaves, jax.tree_util.tree_leaves(out)):
        v = jnp.asarray(v)
        where = f" at {jax.tree_util.keystr(path)}" if path else ""
        if v.shape != g_leaf.shape:
            raise GradientError(
                message(
                    f"{what}: the hook changed the shape of the gradient{where}",
                    expected=f"shape {g_leaf.shape}",
                    got=f"shape {v.shape}",
                    fix="return a gradient of the same shape as x",
                )
            )
        if jnp.iscomplexobj(v) and not jnp.iscomplexobj(g_leaf):
            raise GradientError(
                message(
                    f"{what}: the hook returned a complex gradient{where} for a real x; "
                    "its imaginary part would be lost",
                    expected=f"a real gradient ({describe(g_leaf)})",
                    got=describe(v),
                    fix="return `jnp.real(g)` if only the real part is meant",
                )
            )
        leaves.append(v.astype(g_leaf.dtype))  # the dtype of x's gradient, as `ProjectTo` keeps it
    return jax.tree_util.tree_unflatten(treedef, leaves)


_hook.defvjp(_hook_fwd, _hook_bwd)


def hook(fn: Callable[[Any], Any], x: Any) -> Any:
    """Identity on `x`; in the backward pass, `x`'s gradient is `fn(gradient)`.

    Use it to inspect (print, log, `jax.debug.print`) or change a gradient on its way back.

    Args:
      fn: a function of the cotangent reaching `x` (ChainRules' complex convention); it must
        return a cotangent of the same structure and shapes (not None: to print, return `g`
        after printing), which is cast to the dtype of `x`'s gradient.
      x: an array, a number, or a pytree of them.

    Returns:
      `x` (as an array).

    Raises:
      GradientError: in the backward pass, if `fn` returns None, another structure or shape,
        or a complex gradient for a real `x`.

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
class BufferIndexError(GradientError, IndexError):
    """An index outside a `Buffer` (Zygote's `BoundsError`); also an `IndexError`."""


class BufferTypeError(GradientError, TypeError):
    """A value a `Buffer` cannot hold unchanged (Zygote's `InexactError`); also a `TypeError`."""


class BufferShapeError(GradientError, ValueError):
    """A value whose shape does not fit the indexed part of a `Buffer`; also a `ValueError`."""


@jax.tree_util.register_pytree_node_class
class Buffer:
    """An array that looks mutable (`buf[i] = v`) and stays differentiable.

    Zygote's `Buffer`: code written with in-place writes runs under `gradient` and
    `jax.jit`, because each write is a functional update (`.at[i].set(v)`) of the array the
    buffer holds. `copy()` returns that array and freezes the buffer, as in Zygote.

    Unlike `.at[i].set` and JAX indexing, which drop out-of-bounds writes, clamp out-of-bounds
    reads and convert any value to the array's dtype, a `Buffer` checks like Zygote's:
    indices are in bounds (negative ones count from the end, as in Python), and a written
    value keeps its value: a Python number must fit (no imaginary part in a real buffer, an
    integer within range in an integer buffer: `2.0` fits int32, `1.7` does not), an array
    must promote to the buffer's dtype (int into float, float32 into float64; not complex
    into real, float into int, float64 into float32), and a weakly typed integer array
    (`jnp.array(300)`, a Python int passed to `jax.jit`) must fit as a Python int must.
    Traced indices (under `jax.jit`, in a `fori_loop`) and traced weak integers are checked
    when the program runs: out of bounds or range, it raises `jax.errors.JaxRuntimeError`
    with the same message.

    Args:
      x: the initial contents (an array or number), or, with `shape`, the template whose
        dtype a zero-filled buffer takes (Zygote's `Buffer(xs, dims...)`).
      *shape: the shape of a zero-filled buffer.

    Raises:
      BufferIndexError: (an `IndexError`) on a read or write out of bounds.
      BufferTypeError: (a `TypeError`) on a write of a value the buffer's dtype cannot hold.
      BufferShapeError: (a `ValueError`) on a write of a value that does not broadcast to
        the indexed part.
      GradientError: on a write after `copy()` (all three above are `GradientError`s too).

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
    >>> try:
    ...     zygote_jax.Buffer(jnp.zeros(2))[2]
    ... except IndexError as err:
    ...     print(str(err).splitlines()[0])
    `Buffer`: cannot read at index 2 of a buffer of shape (2,)

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
        _check_index(self._data.shape, index, "read")
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
        part_shape = _check_index(self._data.shape, index, "write")
        value = _check_value(self._data.dtype, index, value)
        if part_shape is not None:
            _check_shape(part_shape, index, value)
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


# Checks of a Buffer read or write: Python work on static shapes, dtypes and concrete indices,
# plus, for traced integer indices only, one compiled bounds test whose callback runs on failure.
_SILENTLY = {"read": "JAX would have clamped this read", "write": "JAX would have dropped this write"}


@functools.lru_cache(maxsize=128)
def _probe(shape: tuple[int, ...]) -> np.ndarray:
    """A read-only array of `shape` that takes no memory: NumPy's indexing checks against it."""
    return np.broadcast_to(np.empty((), bool), shape)


def _index_error(shape, index, action, reason, traced=False) -> BufferIndexError:
    return BufferIndexError(
        message(
            f"`Buffer`: cannot {action} at index {index!r} of a buffer of shape {tuple(shape)}"
            + (" (a traced index, checked as the program ran)" if traced else ""),
            expected="an index within the shape; negative indices count from the end (-1 is the last)",
            got=reason,
            fix=f"correct the index or make the buffer larger (`Buffer(x, dims...)`); {_SILENTLY[action]} silently",
        )
    )


def _check_index(shape: tuple[int, ...], index: Any, action: str) -> tuple[int, ...] | None:
    """The shape of `buf[index]`; raises if a concrete index is out of bounds.

    Traced integer indices get a run-time test; the shape is None when JAX must judge the
    index itself (traced slice bounds or masks, which it rejects with its own error).
    """
    parts = index if isinstance(index, tuple) else (index,)
    concrete, traced = [], []
    for k, part in enumerate(parts):
        if isinstance(part, jax.core.Tracer):
            if not jnp.issubdtype(part.dtype, jnp.integer):
                return None
            traced.append(k)
            part = np.zeros(part.shape, np.intp)  # in bounds unless the axis is empty
        elif isinstance(part, slice) and _traced_slice(part):
            return None
        concrete.append(part)
    try:
        part_shape = _probe(tuple(shape))[tuple(concrete)].shape
    except IndexError as err:
        raise _index_error(shape, index, action, str(err)) from None
    if traced:
        _check_at_run_time(shape, index, parts, traced, action)
    return part_shape


def _traced_slice(part: slice) -> bool:
    return any(isinstance(e, jax.core.Tracer) for e in (part.start, part.stop, part.step))


def _axes_taken(part: Any) -> int:
    if part is None or part is Ellipsis or isinstance(part, (bool, np.bool_)):
        return 0
    return np.ndim(part) if getattr(part, "dtype", None) == np.bool_ else 1


def _check_at_run_time(shape, index, parts, traced, action) -> None:
    """Raise from the running program if a traced index part is out of bounds."""
    axis, axis_of = 0, {}
    for k, part in enumerate(parts):
        if part is Ellipsis:
            axis = len(shape) - sum(_axes_taken(p) for p in parts[k + 1 :])
            continue
        axis_of[k] = axis
        axis += _axes_taken(part)
    tests, checked = [], []
    for k in traced:
        i, size = parts[k], shape[axis_of[k]]
        info = jnp.iinfo(i.dtype)
        outside = [i >= size] if size <= info.max else []
        outside += [i < -size] if -size > info.min else []
        if outside:
            tests.append(jnp.any(functools.reduce(jnp.logical_or, outside)))
            checked.append(k)
    if not tests:
        return
    bad = functools.reduce(jnp.logical_or, tests)
    report = functools.partial(_raise_traced, tuple(shape), index, action, [(k, axis_of[k]) for k in checked])
    jax.lax.cond(bad, lambda: jax.debug.callback(report, bad, [parts[k] for k in checked]), lambda: None)


def _raise_traced(shape, index, action, where, bad, values) -> None:
    if not np.any(bad):  # under `vmap` the callback runs for every batch
        return
    parts = list(index) if isinstance(index, tuple) else [index]
    reasons = []
    for (k, axis), value in zip(where, values):
        value = np.asarray(value)
        parts[k] = value.item() if value.ndim == 0 else value
        size = shape[axis]
        wrong = [int(e) for e in value.ravel() if not -size <= int(e) < size]
        if wrong:
            reasons.append(f"index {wrong[0]} is out of bounds for axis {axis} with size {size}")
    shown = tuple(parts) if isinstance(index, tuple) else parts[0]
    raise _index_error(shape, shown, action, "; ".join(reasons), traced=True)


def _type_error(dtype, index, got: str, expected: str, fix: str) -> BufferTypeError:
    return BufferTypeError(
        message(
            f"`Buffer`: cannot write {got} at index {index!r} into a buffer of dtype {dtype} without changing it",
            expected=expected,
            got=got,
            fix=fix,
        )
    )


def _check_value(dtype: Any, index: Any, value: Any) -> Any:
    """`value`, if the buffer's dtype holds it unchanged (a Python number: converted to fit)."""
    if isinstance(value, (bool, int, float, complex)) and not isinstance(value, np.generic):
        return _fit_number(dtype, index, value)
    if not hasattr(value, "dtype"):
        value = jnp.asarray(value)
    if value.dtype == dtype:
        return value
    try:
        promotes = jnp.result_type(value, dtype) == dtype
    except (TypeError, ValueError):  # e.g. jax_numpy_dtype_promotion="strict"
        promotes = False
    if not promotes:
        raise _type_error(
            dtype,
            index,
            f"a {describe(value)} value",
            f"a value whose dtype promotes to {dtype} (a narrower type of the same kind, or a lower kind)",
            f"convert it explicitly, `buf[i] = v.astype(buf.dtype)` (`jnp.real`, `jnp.round` first if meant), "
            f"or make the buffer with the value's dtype: `Buffer(jnp.zeros(shape, jnp.{value.dtype}))`",
        )
    if getattr(getattr(value, "aval", value), "weak_type", False) and jnp.issubdtype(dtype, jnp.integer):
        _check_weak_integer(dtype, index, value)  # it takes the buffer's dtype, as a Python int would
    return value


def _check_weak_integer(dtype: Any, index: Any, value: Any) -> None:
    """A weakly typed integer array (`jnp.array(300)`, a Python int passed to `jax.jit`)
    promotes to any integer dtype, so it must fit as a Python int must: checked now where
    it is concrete, else as the program runs."""
    info, have = jnp.iinfo(dtype), jnp.iinfo(value.dtype)
    if info.min <= have.min and have.max <= info.max:
        return
    if not isinstance(value, jax.core.Tracer):
        return _raise_unfit(dtype, index, value)
    bad = jnp.any((value < info.min) | (value > info.max))
    report = functools.partial(_raise_unfit, dtype, index)
    jax.lax.cond(bad, lambda: jax.debug.callback(report, value), lambda: None)


def _raise_unfit(dtype: Any, index: Any, value: Any) -> None:
    """`_fit_number`'s error for the first entry of `value` outside `dtype`'s range, if any."""
    value, info = np.asarray(value), jnp.iinfo(dtype)
    outside = value[(value < info.min) | (value > info.max)]
    if outside.size:
        _fit_number(dtype, index, int(outside.flat[0]))


def _fit_number(dtype: Any, index: Any, value: bool | int | float | complex) -> bool | int | float | complex:
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return value
    if isinstance(value, complex):
        if value.imag != 0:
            raise _type_error(
                dtype,
                index,
                repr(value),
                f"a real number: a buffer of dtype {dtype} has no imaginary part",
                "write `v.real` if the imaginary part is meant to go, or make a complex buffer: "
                "`Buffer(jnp.zeros(shape, complex))`",
            )
        value = value.real
    if jnp.issubdtype(dtype, jnp.inexact):
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise _type_error(
                dtype,
                index,
                repr(value),
                f"an integer, for a buffer of dtype {dtype}",
                "round it as meant (`round(v)`, `math.floor(v)`), or make a float buffer: `Buffer(jnp.zeros(shape))`",
            )
        value = int(value)
    low, high = (0, 1) if dtype == np.bool_ else (int(jnp.iinfo(dtype).min), int(jnp.iinfo(dtype).max))
    if not low <= value <= high:
        raise _type_error(
            dtype,
            index,
            repr(value),
            f"a number in [{low}, {high}], for a buffer of dtype {dtype}",
            "make the buffer with a wider dtype, e.g. `Buffer(jnp.zeros(shape, jnp.int64))`",
        )
    return bool(value) if dtype == np.bool_ else int(value)


def _check_shape(part_shape: tuple[int, ...], index: Any, value: Any) -> None:
    got = tuple(np.shape(value))
    if len(got) > len(part_shape) or any(g not in (1, p) for g, p in zip(got[::-1], part_shape[::-1])):
        raise BufferShapeError(
            message(
                f"`Buffer`: cannot write a value of shape {got} at index {index!r}: "
                f"the indexed part has shape {part_shape}",
                expected=f"a value of shape {part_shape}, or one that broadcasts to it (no extra leading axes)",
                got=f"shape {got}",
                fix="index the part the value fills, or reshape the value",
            )
        )
