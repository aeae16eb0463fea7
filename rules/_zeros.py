"""`AbstractZero` and its two singletons, `NoTangent` and `ZeroTangent`.

The algebra is ChainRulesCore's: a zero absorbs `*`, is the identity of `+`, and never
evaluates a thunk it is combined with. Where the two zeros meet, `NoTangent` wins `+`
(the input cannot be perturbed at all) and `ZeroTangent` wins `*`.
"""

from __future__ import annotations

import jax

__all__ = ["AbstractZero", "NoTangent", "ZeroTangent"]


class AbstractZero:
    """A tangent known to be zero without being materialised as an array.

    See also: `NoTangent`, `ZeroTangent`.
    """

    __slots__ = ()
    __array_ufunc__ = None  # numpy returns NotImplemented, so our reflected ops run
    __array_priority__ = 1000
    _instance: "AbstractZero | None" = None

    def __new__(cls):
        if cls is AbstractZero:
            raise TypeError("`AbstractZero` is abstract: use `ZeroTangent()` or `NoTangent()`.")
        if cls._instance is None:
            cls._instance = object.__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __reduce__(self):
        return (type(self), ())

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    # `+`: the identity. The other zero is handled by the subclasses.
    def __add__(self, other):
        if isinstance(other, AbstractZero):
            return _add_zeros(self, other)
        return other

    def __radd__(self, other):
        if isinstance(other, AbstractZero):
            return _add_zeros(other, self)
        return other

    def __sub__(self, other):
        if isinstance(other, AbstractZero):
            return _add_zeros(self, other)
        return -other

    def __rsub__(self, other):
        return self.__radd__(other)

    # `*`: absorbing.
    def __mul__(self, other):
        if isinstance(other, AbstractZero):
            return _mul_zeros(self, other)
        return self

    def __rmul__(self, other):
        if isinstance(other, AbstractZero):
            return _mul_zeros(other, self)
        return self

    __matmul__ = __mul__
    __rmatmul__ = __rmul__

    def __truediv__(self, other):
        return self

    def __neg__(self):
        return self

    def __pos__(self):
        return self

    def __getitem__(self, index):
        return self

    def __iter__(self):
        # As in ChainRulesCore, a zero iterates once, yielding itself. Without this, Python
        # would iterate through __getitem__ forever (`for g in y_bar` in a pullback).
        yield self

    def conj(self):
        return self

    @property
    def real(self):
        return self

    @property
    def T(self):
        return self


def _add_zeros(a: AbstractZero, b: AbstractZero) -> AbstractZero:
    return NoTangent() if isinstance(a, NoTangent) or isinstance(b, NoTangent) else ZeroTangent()


def _mul_zeros(a: AbstractZero, b: AbstractZero) -> AbstractZero:
    return ZeroTangent() if isinstance(a, ZeroTangent) or isinstance(b, ZeroTangent) else NoTangent()


class NoTangent(AbstractZero):
    """The input cannot be perturbed: ints, bools, strings, indices, shapes, callables.

    >>> from rules import NoTangent, ZeroTangent
    >>> NoTangent() + ZeroTangent() is NoTangent()
    True
    >>> NoTangent() * 3.0
    NoTangent()

    See also: `ZeroTangent`, `ProjectTo`.
    """

    __slots__ = ()
    _instance = None


class ZeroTangent(AbstractZero):
    """Perturbing the input does not change the output: a zero that is never materialised.

    >>> from rules import ZeroTangent
    >>> ZeroTangent() + 2.0
    2.0
    >>> ZeroTangent() * 2.0
    ZeroTangent()

    See also: `NoTangent`, `unthunk`.
    """

    __slots__ = ()
    _instance = None


for _cls in (NoTangent, ZeroTangent):
    # Registered as pytree nodes without children: they pass through `jax.jit` and `tree_map`.
    jax.tree_util.register_pytree_node(_cls, lambda z: ((), None), lambda aux, children, c=_cls: c())
