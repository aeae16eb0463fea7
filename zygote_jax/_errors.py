"""Errors and warnings of the user face.

Messages have the shape of the rule system's: which API and function, what was expected,
what was received, and how to fix it.
"""

from __future__ import annotations

from typing import Any

import rules
from rules._errors import format_message

__all__ = ["GradientError", "AdjointWarning", "message", "describe", "name_of"]


class GradientError(rules.RuleError):
    """`zygote_jax` was asked for something it cannot compute (e.g. the gradient of an array).

    A subclass of `rules.RuleError`, so one `except rules.RuleError` catches both faces.

    >>> import jax.numpy as jnp, zygote_jax
    >>> try:
    ...     zygote_jax.gradient(lambda x: 2 * x, jnp.ones(3))
    ... except zygote_jax.GradientError as err:
    ...     print(str(err).splitlines()[0])
    `gradient(<lambda>, ...)`: the function must return a real scalar; gradients are not defined for array outputs

    See also: `AdjointWarning`, `rules.RuleError`.
    """


class AdjointWarning(UserWarning):
    """An `adjoint` was registered for a plain function, which JAX does not consult.

    See also: `adjoint`, `rules.primitive`.
    """


def name_of(f: Any) -> str:
    """A readable name for `f`: `loss`, `<lambda>`, `Dense.__call__`."""
    f = getattr(f, "__rules_key__", f)
    return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__name__


def describe(x: Any) -> str:
    """`float64[2,3]`, `float`, `tuple of 2`: a short description of a value."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{x.dtype}[{','.join(map(str, x.shape))}]" if x.shape else f"{x.dtype} scalar"
    if isinstance(x, (tuple, list, dict)):
        return f"{type(x).__name__} of {len(x)}"
    return type(x).__name__


def message(what: str, *, expected: str | None = None, got: str | None = None, fix: str | None = None) -> str:
    """An error message in the rule system's shape (`rules.format_message`, the one builder)."""
    return format_message(what, expected=expected, got=got, fix=fix)
