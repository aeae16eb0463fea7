"""`NotImplementedTangent`: a known gap in a rule that errors only when it is used."""

from __future__ import annotations

import sys

from ._errors import NotImplementedTangentError, format_message
from ._zeros import AbstractZero

__all__ = ["NotImplementedTangent", "not_implemented"]


class NotImplementedTangent:
    """A cotangent a rule does not compute. It wins `+`, loses `*` against a zero, and raises
    `NotImplementedTangentError` on `-`, `/` or use as an array.

    See also: `not_implemented`.
    """

    __slots__ = ("info", "source")
    __array_ufunc__ = None
    __array_priority__ = 1000

    def __init__(self, info: str = "", source: str = "<unknown>"):
        self.info = info
        self.source = source

    def __repr__(self) -> str:
        return f"NotImplementedTangent({self.info!r}, source={self.source!r})"

    def error(self, operation: str) -> NotImplementedTangentError:
        return NotImplementedTangentError(
            format_message(
                f"a NotImplementedTangent was used ({operation}): the rule defined at "
                f"{self.source} does not implement this derivative: {self.info}",
                fix="do not differentiate with respect to this argument, or implement the "
                "missing derivative in that rule",
            )
        )

    def _raise(self, operation: str):
        raise self.error(operation)

    def __add__(self, other):
        return self

    __radd__ = __add__

    def __mul__(self, other):
        return other if isinstance(other, AbstractZero) else self

    __rmul__ = __mul__
    __matmul__ = __mul__
    __rmatmul__ = __mul__

    def __neg__(self):
        self._raise("negation")

    def __sub__(self, other):
        self._raise("subtraction")

    def __rsub__(self, other):
        self._raise("subtraction")

    def __truediv__(self, other):
        self._raise("division")

    def __rtruediv__(self, other):
        self._raise("division")

    def __array__(self, *args, **kwargs):
        self._raise("conversion to an array")

    # No `__jax_array__`: JAX would then convert it inside `jax_array + dx` instead of handing
    # the operation back to `__radd__`, and NotImplementedTangent must win `+` from either side.

    def __float__(self):
        self._raise("conversion to float")

    def conj(self):
        return self


def not_implemented(info: str = "") -> NotImplementedTangent:
    """Return a `NotImplementedTangent` recording `info` and the caller's source location.

    >>> import rules
    >>> dx = rules.not_implemented("derivative with respect to the order nu")
    >>> (dx + 1.0) is dx, rules.ZeroTangent() * dx
    (True, ZeroTangent())
    >>> -dx
    Traceback (most recent call last):
    ...
    rules._errors.NotImplementedTangentError: a NotImplementedTangent was used (negation): ...

    See also: `NotImplementedTangent`.
    """
    frame = sys._getframe(1)
    return NotImplementedTangent(info, f"{frame.f_code.co_filename}:{frame.f_lineno}")
