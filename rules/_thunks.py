"""Lazily computed tangents: `Thunk`, `InplaceableThunk`, `unthunk`.

A thunk defers a cotangent until it is needed. Combining a thunk with a zero never evaluates
it; any other arithmetic evaluates it first. The JAX lowering unthunks the cotangents of
perturbed inputs only.
"""

from __future__ import annotations

from typing import Any, Callable

from ._notimplemented import NotImplementedTangent
from ._zeros import AbstractZero

# What a thunk returns unevaluated when combined with it: zeros (identity of + / absorbing *)
# and NotImplementedTangent (wins + and *).
_PASS = (AbstractZero, NotImplementedTangent)

__all__ = ["AbstractThunk", "Thunk", "InplaceableThunk", "thunk", "unthunk"]


class AbstractThunk:
    """A tangent whose value is computed on demand by `unthunk`."""

    __slots__ = ()
    __array_ufunc__ = None
    __array_priority__ = 1000

    def unthunk(self) -> Any:
        raise NotImplementedError

    def __call__(self) -> Any:
        return unthunk(self)

    def __add__(self, other):
        if isinstance(other, AbstractZero):
            return self
        if isinstance(other, NotImplementedTangent):
            return other
        return unthunk(self) + unthunk(other)

    def __radd__(self, other):
        if isinstance(other, AbstractZero):
            return self
        if isinstance(other, NotImplementedTangent):
            return other
        return unthunk(other) + unthunk(self)

    def __sub__(self, other):
        if isinstance(other, AbstractZero):
            return self
        return unthunk(self) - unthunk(other)

    def __rsub__(self, other):
        if isinstance(other, AbstractZero):
            return -unthunk(self)
        return unthunk(other) - unthunk(self)

    def __mul__(self, other):
        if isinstance(other, _PASS):
            return other
        return unthunk(self) * unthunk(other)

    def __rmul__(self, other):
        if isinstance(other, _PASS):
            return other
        return unthunk(other) * unthunk(self)

    def __matmul__(self, other):
        if isinstance(other, AbstractZero):
            return other
        return unthunk(self) @ unthunk(other)

    def __rmatmul__(self, other):
        if isinstance(other, AbstractZero):
            return other
        return unthunk(other) @ unthunk(self)

    def __truediv__(self, other):
        return unthunk(self) / unthunk(other)

    def __neg__(self):
        return -unthunk(self)

    def conj(self):
        value = unthunk(self)
        return value.conj() if hasattr(value, "conj") else value


class Thunk(AbstractThunk):
    """A cotangent computed by calling `fn()` when (and each time) it is unthunked.

    >>> from rules import Thunk, ZeroTangent, unthunk
    >>> t = Thunk(lambda: 2.0 * 3.0)
    >>> unthunk(t)
    6.0
    >>> (t + ZeroTangent()) is t
    True

    See also: `thunk`, `InplaceableThunk`, `unthunk`.
    """

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]):
        if not callable(fn):
            raise TypeError(f"`Thunk` needs a callable of no arguments; got {type(fn).__name__}.")
        self.fn = fn

    def unthunk(self) -> Any:
        return unthunk(self.fn())

    def __repr__(self) -> str:
        return f"Thunk({getattr(self.fn, '__qualname__', self.fn)!r})"


class InplaceableThunk(AbstractThunk):
    """A thunk that also knows how to add itself to an accumulated cotangent.

    `add_fn(acc)` must return `acc + value` (JAX arrays are immutable, so "in place" means
    without materialising `value` on its own, e.g. a scatter-add into `acc`); `val` is a
    `Thunk` (or value) computing the cotangent alone. The two must agree, which
    `rules.testing.test_rrule` checks.

    >>> import jax.numpy as jnp
    >>> from rules import InplaceableThunk, Thunk, unthunk
    >>> t = InplaceableThunk(lambda acc: acc.at[1].add(5.0), Thunk(lambda: jnp.array([0.0, 5.0])))
    >>> unthunk(t)
    Array([0., 5.], dtype=float64)
    >>> jnp.ones(2) + t
    Array([1., 6.], dtype=float64)

    See also: `Thunk`, `unthunk`.
    """

    __slots__ = ("add_fn", "val")

    def __init__(self, add_fn: Callable[[Any], Any], val: Any):
        if not callable(add_fn):
            raise TypeError(
                f"`InplaceableThunk(add_fn, val)`: add_fn must be callable; got {type(add_fn).__name__}."
            )
        self.add_fn = add_fn
        self.val = val

    def unthunk(self) -> Any:
        return unthunk(self.val)

    def __add__(self, other):
        if isinstance(other, AbstractZero):
            return self
        if isinstance(other, NotImplementedTangent):
            return other
        if isinstance(other, AbstractThunk):
            return unthunk(self) + unthunk(other)
        return self.add_fn(other)

    def __radd__(self, other):
        if isinstance(other, AbstractZero):
            return self
        if isinstance(other, NotImplementedTangent):
            return other
        if isinstance(other, AbstractThunk):
            return unthunk(other) + unthunk(self)
        return self.add_fn(other)

    def __repr__(self) -> str:
        return f"InplaceableThunk({self.add_fn!r}, {self.val!r})"


def thunk(fn: Callable[[], Any]) -> Thunk:
    """Wrap `fn` (no arguments) as a lazily evaluated `Thunk`; usable as a decorator.

    >>> from rules import thunk, unthunk
    >>> @thunk
    ... def dx():
    ...     return 1.5
    >>> unthunk(dx)
    1.5

    See also: `Thunk`, `unthunk`.
    """
    return Thunk(fn)


def unthunk(x: Any) -> Any:
    """Evaluate `x` if it is a thunk (repeatedly, for thunks of thunks); else return it.

    >>> from rules import Thunk, unthunk
    >>> unthunk(Thunk(lambda: Thunk(lambda: 4)))
    4
    >>> unthunk(3)
    3

    See also: `Thunk`, `InplaceableThunk`.
    """
    while isinstance(x, AbstractThunk):
        x = x.unthunk()
    return x
