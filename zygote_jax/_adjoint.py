"""`adjoint`: Zygote's rule format, converted into an rrule of the rule system.

A Zygote adjoint returns `(y, back)` where `back(y_bar)` returns gradients for the
arguments only, `None` meaning zero. ChainRules' rrule returns `(y, pullback)` where
`pullback(y_bar)` returns `(f_bar, x1_bar, ...)`. The conversion adds `NoTangent()` for the
function, turns `None` (also inside a pytree gradient) into `ZeroTangent()`, and hands
`back` the output cotangent with `None` for zero parts (Zygote's `nothing`). Both use
ChainRules' complex convention.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable

import jax

import rules

from ._errors import AdjointWarning, GradientError, message, name_of

__all__ = ["adjoint"]


def _zygote_cotangent(y_bar: Any) -> Any:
    """A ChainRules cotangent in Zygote's form: thunks evaluated, zeros as None."""
    y_bar = rules.unthunk(y_bar)
    if isinstance(y_bar, rules.AbstractZero):
        return None
    if isinstance(y_bar, (tuple, list, dict)):
        return jax.tree_util.tree_map(
            lambda t: None if isinstance(rules.unthunk(t), rules.AbstractZero) else rules.unthunk(t),
            y_bar,
            is_leaf=lambda t: isinstance(t, (rules.AbstractZero, rules.AbstractThunk)),
        )
    return y_bar


def _chainrules_cotangent(g: Any) -> Any:
    """A Zygote gradient as a ChainRules cotangent: `None` (anywhere in a pytree) is `ZeroTangent()`."""
    return jax.tree_util.tree_map(lambda v: rules.ZeroTangent() if v is None else v, g, is_leaf=lambda v: v is None)


def _rrule_from_adjoint(f: Any, adjoint_fn: Callable) -> Callable:
    name = name_of(f)

    def adjoint_rrule(*args: Any, **kwargs: Any):
        result = adjoint_fn(*args, **kwargs)
        if not (isinstance(result, tuple) and len(result) == 2 and callable(result[1])):
            raise GradientError(
                message(
                    f"the adjoint of `{name}` (`{name_of(adjoint_fn)}`) must return (y, back)",
                    expected="a tuple (y, back) with a callable back",
                    got=type(result).__name__ + (f" of length {len(result)}" if isinstance(result, tuple) else ""),
                )
            )
        y, back = result
        nargs = len(args)

        def adjoint_pullback(y_bar: Any) -> tuple:
            y_bar = _zygote_cotangent(y_bar)
            if y_bar is None:
                return (rules.NoTangent(),) + (rules.ZeroTangent(),) * nargs
            grads = back(y_bar)
            if not isinstance(grads, tuple) or len(grads) != nargs:
                raise GradientError(
                    message(
                        f"the pullback of the adjoint of `{name}` must return a tuple with one gradient per argument",
                        expected=f"a tuple of {nargs} (None for zero), e.g. `(x_bar,)` for one argument",
                        got=type(grads).__name__ + (f" of length {len(grads)}" if isinstance(grads, tuple) else ""),
                        fix="return a tuple, one gradient per positional argument; None means zero",
                    )
                )
            return (rules.NoTangent(),) + tuple(_chainrules_cotangent(g) for g in grads)

        adjoint_pullback.__name__ = adjoint_pullback.__qualname__ = f"{name}_pullback"
        return y, adjoint_pullback

    adjoint_rrule.__name__ = adjoint_rrule.__qualname__ = f"{name}_rrule"
    return adjoint_rrule


def adjoint(f: Any, *, types: Iterable | None = None) -> Callable[[Callable], Callable]:
    """Define the derivative of `f` in Zygote's format (`@adjoint`); it becomes an rrule of `f`.

    The decorated function takes `f`'s arguments and returns `(y, back)`: `y = f(...)`
    and `back(y_bar)`, a tuple with one gradient per positional argument (`None` for
    zero; a 1-tuple for one argument). `back` receives the output's cotangent, with `None`
    for parts that are zero, and is not called when all of it is zero.

    The rule is registered with `rules.rrule.register(f, ...)`. When `f` is a
    `rules.Primitive`, `gradient`, `jax.grad`, `jax.jit` and `jax.vmap` use it. A plain
    function is not seen by JAX, so `adjoint` warns (`AdjointWarning`); wrap it,
    `f = rules.primitive(f)`, and call the wrapped function (the rule, registered for the
    plain function, applies to the primitive too).

    Args:
      f: the function (best a `rules.Primitive`).
      types: optional argument types the rule is restricted to, as in `rules.rrule.register`.

    Returns:
      A decorator that registers the adjoint and returns the decorated function unchanged
      (as `rules.rrule.register` does), so neither `f` nor the adjoint is rebound.

    Raises:
      GradientError: when the rule runs, if the adjoint does not return `(y, back)` or
        `back` does not return a tuple of one gradient per argument.

    >>> import jax, jax.numpy as jnp, rules, zygote_jax
    >>> @rules.primitive
    ... def mysin(x):
    ...     return jnp.sin(x)
    >>> @zygote_jax.adjoint(mysin)
    ... def mysin_adjoint(x):
    ...     return mysin(x), lambda y_bar: (y_bar * jnp.cos(x),)
    >>> float(zygote_jax.gradient(mysin, 0.0)[0]), float(jax.jit(jax.grad(mysin))(0.0))
    (1.0, 1.0)

    See also: `rules.rrule`, `rules.primitive`, `pullback`.
    """

    def register(adjoint_fn: Callable) -> Callable:
        rules.rrule.register(f, _rrule_from_adjoint(f, adjoint_fn), types=types, plain=True)  # warned below
        if not isinstance(f, rules.Primitive):
            warnings.warn(
                f"`adjoint({name_of(f)})`: `{name_of(f)}` is a plain function, so JAX transformations "
                "(gradient, jax.grad, jax.jit, jax.vmap) do not see this rule; only `rules.rrule` does. "
                f"Wrap it with `rules.primitive` (`{name_of(f)} = rules.primitive({name_of(f)})`) and call "
                "the wrapped function: the rule registered for the plain function applies to it.",
                AdjointWarning,
                stacklevel=2,
            )
        return adjoint_fn

    return register
