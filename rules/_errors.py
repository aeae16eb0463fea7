"""Errors raised by the rule system.

Every message follows one shape: which function or rule, which argument (index and pytree path),
what was expected, what was received, and how to fix it.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal, overload

import jax

__all__ = [
    "RuleError",
    "RuleDefinitionError",
    "AmbiguousRuleError",
    "PullbackError",
    "ProjectionError",
    "TangentStructureError",
    "NotImplementedTangentError",
    "ForwardModeError",
    "StaticArgumentError",
    "LoweringContractError",
    "TracerClosureError",
    "format_message",
    "naming",
]


def format_message(
    what: str,
    *,
    argument: str | None = None,
    expected: str | None = None,
    got: str | None = None,
    fix: str | None = None,
) -> str:
    """Build a rule-error message with the fixed sections in a fixed order."""
    lines = [what]
    if argument is not None:
        lines.append(f"  argument: {argument}")
    if expected is not None:
        lines.append(f"  expected: {expected}")
    if got is not None:
        lines.append(f"  got:      {got}")
    if fix is not None:
        lines.append(f"  fix:      {fix}")
    return "\n".join(lines)


@overload
def describe_argument(index: int | str, path: str = ..., fn: Any = ...) -> str: ...
@overload
def describe_argument(index: None, path: str = ..., fn: Any = ...) -> None: ...
def describe_argument(index: int | str | None, path: str = "", fn: Any = None) -> str | None:
    """`argument 1 (x) at path [0]['w']`, `keyword argument 'axis'`, or the output.

    `index` counts positional arguments from 0, as Python indexes them; the text counts
    them as the user does, from 1, which is also the argument's slot in a pullback's result
    `(f_bar, x1_bar, ...)`. With `fn`, the parameter's name follows in parentheses.

    >>> describe_argument(0, "['w']", fn=lambda x, y: x)
    "argument 1 (x) at path ['w']"
    """
    if index is None:
        return None
    if isinstance(index, str):
        where = f"keyword argument {index!r}" if index != "output" else "the output"
    else:
        name = parameter_name(fn, index) if fn is not None else None
        where = f"argument {index + 1}" + (f" ({name})" if name else "")
    return f"{where} at path {path}" if path else where


def parameter_name(fn: Any, index: int) -> str | None:
    """The name of `fn`'s positional parameter `index` (`args[2]` inside `*args`), or None."""
    fn = getattr(fn, "__rules_key__", fn)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if index < len(positional):
        return positional[index].name
    star = [p for p in params if p.kind == p.VAR_POSITIONAL]
    return f"{star[0].name}[{index - len(positional)}]" if star else None


class RuleError(Exception):
    """Base class: a rule, or its use, breaks the conventions of the rule system."""


class RuleDefinitionError(RuleError, TypeError):
    """A rule is registered or written in a way the registry cannot use."""


class AmbiguousRuleError(RuleError, TypeError):
    """Two registered rules match the same arguments and neither is more specific."""


class PullbackError(RuleError, TypeError):
    """A pullback (or pushforward) returned something of the wrong form."""


class ProjectionError(RuleError, ValueError):
    """A cotangent cannot be projected onto its primal (shape, dtype or structure)."""


class TangentStructureError(RuleError, ValueError):
    """A structural `Tangent` does not match the fields of its primal type."""


class NotImplementedTangentError(RuleError, NotImplementedError):
    """A `NotImplementedTangent` was used where its value matters."""


class ForwardModeError(RuleError, TypeError):
    """Forward mode was asked of a primitive that has none: an rrule whose pullback JAX cannot
    transpose, and no frule."""


class StaticArgumentError(RuleError, TypeError):
    """A static (non-array) argument of a primitive cannot be used as a cache key."""


class LoweringContractError(RuleError, RuntimeError):
    """The installed JAX does not keep the contract the dual-mode lowering is built on (its
    first use checks a small primitive against JAX's own derivatives)."""


class TracerClosureError(RuleError, jax.errors.UnexpectedTracerError):
    """A rule (or its function) closes over a value traced by a JAX transformation that
    encloses the primitive's call but not its differentiation (a `jax.vmap` inside
    `jax.grad`): the rule runs beneath that transformation and cannot see its tracers, as
    with a `jax.custom_vjp`. Still a `jax.errors.UnexpectedTracerError`."""

    def __init__(self, message: str):
        Exception.__init__(self, message)  # JAX's own __init__ appends its general advice


class naming:
    """Add a note naming the rule to an exception raised by user code (rule, pullback, thunk).

    A class, not a generator context manager: it runs on every eager differentiation.
    """

    __slots__ = ("what", "name")

    def __init__(self, what: Any, name: str | None = None):
        self.what, self.name = what, name

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, tb) -> Literal[False]:
        if isinstance(err, jax.errors.UnexpectedTracerError) and self.name is not None and not isinstance(err, RuleError):
            raise TracerClosureError(format_message(
                f"the rrule of `{self.name}` (its pullback, or its function) uses a tracer of another trace: a value "
                "closed over from a JAX transformation that encloses the call but not its differentiation "
                "(a jax.vmap inside jax.grad), or one kept from an earlier trace; the rule runs beneath "
                "that transformation, as a jax.custom_vjp's fwd and bwd do, and cannot see its tracers",
                got=str(err).splitlines()[0] if str(err) else type(err).__name__,
                fix=f"pass the value to `{self.name}` as an argument instead of closing over it "
                f"(rules.primitive(lambda x, a: ...)(x, a)), or define `{self.name}` outside the transformation",
            )) from err
        if isinstance(err, Exception) and not isinstance(err, RuleError):
            err.add_note(self.what() if callable(self.what) else self.what)
        return False
