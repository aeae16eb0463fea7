"""Definition helpers: `scalar_rule`, `non_differentiable`, `ignore_derivatives`."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import RuleDefinitionError, format_message
from ._primitive import unwrap
from ._projection import ProjectTo, is_differentiable_leaf
from ._registry import frule, function_name, register_examples, rrule, warn_if_plain
from ._thunks import thunk, unthunk
from ._notimplemented import NotImplementedTangent
from ._zeros import AbstractZero, NoTangent, ZeroTangent

__all__ = ["scalar_rule", "non_differentiable", "ignore_derivatives"]


def _partials_table(f: Any, partials: Any, nargs: int, nouts: int | None) -> tuple[tuple[Any, ...], ...]:
    """Normalise the partials to one tuple per output, one entry per argument."""
    rows = partials if nouts is not None else (partials,)
    if nouts is not None and (not isinstance(rows, tuple) or len(rows) != nouts):
        raise RuleDefinitionError(
            format_message(
                f"scalar_rule for `{function_name(f)}`: the partials must have one row per output",
                expected=f"a tuple of {nouts} tuples",
                got=f"{type(rows).__name__}",
            )
        )
    table = []
    for row in rows:
        row = row if isinstance(row, tuple) else (row,)
        if len(row) != nargs:
            raise RuleDefinitionError(
                format_message(
                    f"scalar_rule for `{function_name(f)}`: wrong number of partials",
                    expected=f"{nargs} partial(s), one per argument",
                    got=f"{len(row)}",
                    fix="return a tuple with one partial derivative per argument",
                )
            )
        table.append(row)
    return tuple(table)


def _broadcast(x: Any, shape: tuple) -> Any:
    x = jnp.asarray(x)
    return x if x.shape == shape else jnp.broadcast_to(x, shape)


def _unbroadcast(dx: Any, shape: tuple) -> Any:
    """Sum `dx` over the dimensions that broadcasting added or stretched to reach it."""
    dx = jnp.asarray(dx)
    if dx.shape == shape:
        return dx
    lead = dx.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and dx.shape[lead + i] != 1)
    summed = jnp.sum(dx, axis=axes) if axes else dx
    return summed.reshape(shape)


def _signature(f: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(f)
    except (TypeError, ValueError):  # a builtin without one: keywords then pass as given
        return None


def _positional(sig: inspect.Signature | None, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`f(*args, **kwargs)` with every keyword that names a positional parameter moved into place.

    The partials see arguments by position only, so `elu(x, alpha=2.0)` must reach them as
    `elu(x, 2.0)`; parameters skipped before a moved one get their defaults. Keyword-only
    parameters have no place: they stay keywords, except one passed as its own default (a
    `jnp` ufunc's `where=None`), which is dropped so that partials need not accept it.
    """
    if sig is None:
        return args, kwargs
    bound = sig.bind(*args, **kwargs).arguments
    positional: list = []
    given = 0  # how many leading positional slots the call fills
    keywords: dict = {}
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            positional.extend(bound.get(p.name, ()))
            given = len(positional)
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional.append(bound.get(p.name, p.default))
            given = len(positional) if p.name in bound else given
        elif p.kind is p.VAR_KEYWORD:
            keywords.update(bound.get(p.name, {}))
        elif p.name in bound and bound[p.name] is not p.default:
            keywords[p.name] = bound[p.name]
    return tuple(positional[:given]), keywords


def scalar_rule(
    f: Any, partials: Callable[..., Any], *, examples: Iterable[tuple] | None = None, plain: bool = False
) -> Any:
    """Define the frule and rrule of an elementwise function from its partial derivatives.

    `partials(*args, y)` receives the arguments, then the output, and returns the partial
    (one argument), a tuple of partials (one per argument), or, for a function with several
    outputs, a tuple of such tuples (one per output). Arrays broadcast: the rrule sums over
    broadcast dimensions. The rrule multiplies by the conjugate partial (holomorphic
    convention). Arguments JAX cannot differentiate (ints, bools) get `NoTangent()`. A
    partial may be a `thunk`, computed only for an argument with a nonzero tangent or
    cotangent: one with no derivative of its own, which `jax.hessian` in another argument
    would otherwise differentiate. Under JAX, the frule is what a primitive lowers to
    (`jax.custom_jvp`), so both forward and reverse mode work; the rrule answers
    `rules.rrule(f, ...)` and `rrule_via_ad`.
    Arguments given by keyword are bound by `f`'s signature and reach `partials` in their
    positional place (`elu(x, alpha=2.0)` as `elu(x, 2.0)`; keyword-only ones by keyword); as
    every keyword argument of a rule, they are constants: no tangent, no cotangent.

    >>> import jax.numpy as jnp
    >>> import rules
    >>> @rules.primitive
    ... def hypot(a, b):
    ...     return jnp.sqrt(a * a + b * b)
    >>> _ = rules.scalar_rule(hypot, lambda a, b, y: (a / y, b / y))
    >>> y, back = rules.rrule(hypot, 3.0, 4.0)
    >>> y, [float(rules.unthunk(t)) for t in back(1.0)[1:]]
    (Array(5., dtype=float64, weak_type=True), [0.6, 0.8])

    `f` should be a `rules.Primitive`: for a plain function, JAX never consults the rules
    and this warns (`PlainFunctionWarning`), unless `plain=True` (as for the library's rules
    keyed on `jax.numpy` functions, which serve `rules.rrule(jnp.sin, x)` and `rrule_via_ad`).

    Returns:
      `f`, so the call can sit next to its definition.

    See also: `rrule`, `frule`, `non_differentiable`.
    """
    if not plain:
        warn_if_plain(f, f"scalar_rule({function_name(f)}, ...)", stacklevel=2)
    raw = unwrap(f)
    if examples is not None:
        register_examples(f, examples)
    name = getattr(raw, "__name__", "f")
    sig = _signature(raw)

    def scalar_frule(tangents, *args, **kwargs):
        if kwargs:  # moved into place with no tangent: keyword arguments are constants
            n = len(args)
            args, kwargs = _positional(sig, args, kwargs)
            tangents = (*tangents, *(NoTangent(),) * (len(args) - n))
        y = raw(*args, **kwargs)
        multi = isinstance(y, tuple)
        table = _partials_table(f, partials(*args, y, **kwargs), len(args), len(y) if multi else None)
        outs = y if multi else (y,)
        dots = []
        for out, row in zip(outs, table):
            shape = jnp.shape(out)
            acc: Any = ZeroTangent()
            for x, x_dot, p in zip(args, tangents[1:], row):
                x_dot = unthunk(x_dot)
                if isinstance(x_dot, AbstractZero) or not is_differentiable_leaf(x):
                    continue
                p = unthunk(p)  # a thunk's partial: computed only for an argument that moves
                if isinstance(p, AbstractZero):
                    continue
                if isinstance(p, NotImplementedTangent):  # the tangent is not implemented either
                    acc = acc + p
                    continue
                acc = acc + _broadcast(p, shape) * _broadcast(x_dot, shape)
            dots.append(acc)
        return y, (tuple(dots) if multi else dots[0])

    def scalar_rrule(*args, **kwargs):
        n = len(args)  # the pullback answers for these; keyword arguments are constants
        if kwargs:
            args, kwargs = _positional(sig, args, kwargs)
        y = raw(*args, **kwargs)
        multi = isinstance(y, tuple)
        table = _partials_table(f, partials(*args, y, **kwargs), len(args), len(y) if multi else None)
        projectors = [ProjectTo(x) if i < n and is_differentiable_leaf(x) else None for i, x in enumerate(args)]
        shapes = [jnp.shape(x) for x in args]

        def cotangent(i, y_bar):
            acc: Any = ZeroTangent()
            for j, row in enumerate(table):
                g = unthunk(y_bar[j] if multi else y_bar)
                p = ZeroTangent() if isinstance(g, AbstractZero) else unthunk(row[i])
                if isinstance(p, AbstractZero):
                    continue
                acc = acc + (p if isinstance(p, NotImplementedTangent) else g * jnp.conj(p))
            if isinstance(acc, (AbstractZero, NotImplementedTangent)):
                return acc
            return projectors[i](_unbroadcast(acc, shapes[i]))

        def pullback(y_bar):
            y_bar = unthunk(y_bar)
            if n == 1:
                return NoTangent(), cotangent(0, y_bar) if projectors[0] is not None else NoTangent()
            return (NoTangent(),) + tuple(
                NoTangent() if projectors[i] is None else thunk(lambda i=i: cotangent(i, y_bar))
                for i in range(n)
            )

        pullback.__name__ = pullback.__qualname__ = f"{name}_pullback"
        return y, pullback

    scalar_frule.__name__ = f"{name}_frule"
    scalar_rrule.__name__ = f"{name}_rrule"
    # The frule is the same rule (elementwise partials): lower it through custom_jvp, so a
    # primitive with a scalar rule has forward mode as well as reverse mode.
    setattr(scalar_rrule, "__rules_lower_with_frule__", True)  # setattr: mypy knows no such function attribute
    frule.register(f, scalar_frule, plain=True)
    rrule.register(f, scalar_rrule, plain=True)
    return f


def non_differentiable(
    f: Any, *, types: Iterable | None = None, examples: Iterable[tuple] | None = None, plain: bool = False
) -> Any:
    """Declare `f` not differentiable: its rules return `NoTangent()` for every argument.

    As for `scalar_rule`, a plain `f` warns unless `plain=True`: JAX never sees its rules.

    >>> import jax.numpy as jnp
    >>> import rules
    >>> _ = rules.non_differentiable(jnp.argmax, plain=True)
    >>> y, back = rules.rrule(jnp.argmax, jnp.array([1.0, 3.0, 2.0]))
    >>> int(y), back(1.0)
    (1, (NoTangent(), NoTangent()))

    See also: `scalar_rule`, `ignore_derivatives`.
    """
    if not plain:
        warn_if_plain(f, f"non_differentiable({function_name(f)})", stacklevel=2)
    raw = unwrap(f)
    if examples is not None:
        register_examples(f, examples)

    def non_differentiable_frule(tangents, *args, **kwargs):
        return raw(*args, **kwargs), NoTangent()

    def non_differentiable_rrule(*args, **kwargs):
        def non_differentiable_pullback(y_bar):
            return (NoTangent(),) * (1 + len(args))

        return raw(*args, **kwargs), non_differentiable_pullback

    setattr(non_differentiable_rrule, "__rules_lower_with_frule__", True)  # as in scalar_rule
    frule.register(f, non_differentiable_frule, types=types, plain=True)
    rrule.register(f, non_differentiable_rrule, types=types, plain=True)
    return f


def ignore_derivatives(x: Any) -> Any:
    """The value passes; its derivative is dropped. A callable is called first (a thunk).

    >>> import jax
    >>> import rules
    >>> float(jax.grad(lambda x: x * rules.ignore_derivatives(x))(3.0))
    3.0
    >>> float(jax.grad(lambda x: rules.ignore_derivatives(lambda: x ** 2) + x)(3.0))
    1.0

    See also: `non_differentiable`, `jax.lax.stop_gradient`.
    """
    if callable(x) and not isinstance(x, (jax.Array, np.ndarray)):
        x = x()
    return jax.tree_util.tree_map(
        lambda leaf: jax.lax.stop_gradient(leaf) if is_differentiable_leaf(leaf) and not isinstance(leaf, (float, complex)) else leaf,
        x,
    )


non_differentiable(ignore_derivatives, plain=True)  # for rules.rrule(ignore_derivatives, x)
