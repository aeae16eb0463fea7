"""Logarithms and exponentials at their edges, as LogExpFunctions.jl has them.

`xlogy` and `xlog1py` are JAX's own functions (`jax.scipy.special`) with rules keyed on them:
the value is JAX's, the derivatives are right where JAX's are NaN. `xlogx` (LogExpFunctions'
name), `xexpy` and `exprel` (SciPy's name; JAX has none) are primitives of this module.

Strong zeros: the rules of the x*log(y) family multiply every incoming tangent or cotangent
by its partial so that an exact 0 stays 0 even where the partial is infinite (as ForwardDiff's
NaN-safe mode does): 0 * log(0) is 0 here, not NaN. A product with zero input is the whole
point of these functions (x log y is 0 at x = 0 for every y), and it is what lets
`x * xlogx(x)` have the gradient 0 at 0 (see `xlogx`). ChainRules.jl's rules do not do this;
where we choose otherwise, each docstring says so.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np

from .._errors import format_message
from .._helpers import _broadcast, _unbroadcast
from .._primitive import primitive
from .._projection import ProjectTo, is_differentiable_leaf
from .._registry import frule, register_examples, rrule
from .._thunks import unthunk
from .._zeros import AbstractZero, NoTangent, ZeroTangent

__all__ = ["xlogy", "xlog1py", "xlogx", "xexpy", "exprel", "weighted_logsumexp", "logsumexp"]

# Example inputs: ordinary points, and the edges the rules exist for (x = 0, y = 0 or -1).
_X = np.array([0.0, 0.7, 1.9, 2.5])
_Y = np.array([0.0, 0.4, 1.3, 3.0])
_X32 = np.array([0.0, 0.5, 2.0], np.float32)
_Y32 = np.array([0.6, 0.0, 1.5], np.float32)


# ----- strong zeros -------------------------------------------------------------------------
def _times(t: Any, p: Any) -> Any:
    """t * p, and exactly 0 where t == 0 and p is infinite or NaN (a strong zero); only there,
    so that the derivative of t * p in t (p) is kept where t happens to be 0."""
    prod = t * p
    return jnp.where((t == 0) & ~jnp.isfinite(p), jnp.zeros_like(prod), prod)


def _strong_rules(f: Any, fn: Callable, partials: Callable, *, plain: bool) -> None:
    """Register an frule and an rrule for the elementwise `fn` (the key `f`) from its partials.

    `partials(*args)` returns one partial per argument, in the output's dtype, broadcastable
    to its shape. Each tangent (frule) and the cotangent (rrule) meets its partial through
    `_times`, so an exact zero stays zero. Holomorphic convention for complex inputs (the
    rrule multiplies by the conjugate partial), as `rules.scalar_rule`.
    """
    name = getattr(fn, "__name__", "f")

    def strong_frule(tangents, *args):
        y = fn(*args)
        shape, dtype = jnp.shape(y), jnp.result_type(y)
        parts = partials(*args)
        y_dot: Any = ZeroTangent()
        for x, x_dot, p in zip(args, tangents[1:], parts):
            x_dot = unthunk(x_dot)
            if isinstance(x_dot, AbstractZero) or not is_differentiable_leaf(x):
                continue
            y_dot = y_dot + _times(_broadcast(x_dot, shape).astype(dtype), _broadcast(p, shape)).astype(dtype)
        return y, y_dot

    def strong_rrule(*args):
        y = fn(*args)
        shape = jnp.shape(y)
        parts = partials(*args)
        projectors = [ProjectTo(x) if is_differentiable_leaf(x) else None for x in args]
        shapes = [jnp.shape(x) for x in args]

        def pullback(y_bar):
            y_bar = unthunk(y_bar)
            out: list = [NoTangent()]
            for p, project_x, x_shape in zip(parts, projectors, shapes):
                if project_x is None:
                    out.append(NoTangent())
                elif isinstance(y_bar, AbstractZero):
                    out.append(ZeroTangent())
                else:
                    x_bar = _times(_broadcast(y_bar, shape), jnp.conj(_broadcast(p, shape)))
                    out.append(project_x(_unbroadcast(x_bar, x_shape)))
            return tuple(out)

        pullback.__name__ = pullback.__qualname__ = f"{name}_pullback"
        return y, pullback

    strong_frule.__name__ = f"{name}_frule"
    strong_rrule.__name__ = f"{name}_rrule"
    frule.register(f, strong_frule, plain=plain)
    rrule.register(f, strong_rrule, plain=plain)


def _as_result(dtype: Any, *args: Any) -> list:
    return [jnp.asarray(a, dtype) for a in args]


def _safe(where: Any, x: Any, fill: float = 1.0) -> Any:
    """x, with `fill` where `where` holds (so that an unselected branch stays finite)."""
    return jnp.where(where, jnp.asarray(fill, jnp.result_type(x)), x)


# ----- xlogy --------------------------------------------------------------------------------
def _xlogy_partials(x, y):
    x, y = _as_result(jnp.result_type(jsp.xlogy(x, y)), x, y)
    zero = (x == 0) & (y == 0)  # only 0/0: elsewhere x / y is 0 at x == 0, and its d/dx 1/y kept
    return jnp.log(y), jnp.where(zero, 0.0, x / _safe(zero, y)).astype(x.dtype)


_strong_rules(jsp.xlogy, jsp.xlogy, _xlogy_partials, plain=True)
register_examples(jsp.xlogy, [(_X, _Y + 0.5), (_X32, _Y32 + 0.25), (np.array([[0.0], [1.5]]), _Y[None, 1:])])

xlogy = primitive(jsp.xlogy)
xlogy.__doc__ = """x * log(y), 0 where x == 0: `jax.scipy.special.xlogy` with derivatives right at x == 0.

Why a rule: xlogy(0, y) is 0 for every y, so d/dy is exactly 0 at x == 0, y == 0 too, where
JAX's `x / y` is 0/0 = NaN. The value is JAX's (NaN in y propagates, as SciPy's).

d/dx = log(y): -inf at y == 0 (the true one-sided slope: xlogy(x, 0) is -inf for x > 0 and
+inf for x < 0, so no finite value is right). d/dy = x / y, and 0 where x == 0. Tangents and
cotangents are strong zeros (0 * -inf = 0), which ChainRules.jl's rule (`x / y`, NaN at the
origin) does not do; see the module's docstring.

Args:
  x: the factor (real; broadcasts with `y`).
  y: the argument of the logarithm, y >= 0.

Returns:
  x log(y), broadcast shape, promoted floating dtype.

>>> import jax
>>> from rules.library.logexp import xlogy
>>> float(xlogy(0.0, 0.0)), float(jax.grad(xlogy, argnums=1)(0.0, 0.0))
(0.0, 0.0)
>>> float(jax.grad(xlogy, argnums=0)(1.0, 0.0))
-inf

See also: `xlog1py`, `xlogx`, `jax.scipy.special.xlogy`.
"""


# ----- xlog1py ------------------------------------------------------------------------------
def _xlog1py_partials(x, y):
    x, y = _as_result(jnp.result_type(jsp.xlog1py(x, y)), x, y)
    zero = (x == 0) & (y == -1)  # only 0/0, as for xlogy
    return jnp.log1p(y), jnp.where(zero, 0.0, x / _safe(zero, 1 + y)).astype(x.dtype)


_strong_rules(jsp.xlog1py, jsp.xlog1py, _xlog1py_partials, plain=True)
register_examples(jsp.xlog1py, [(_X, _Y - 0.5), (_X32, _Y32 - 0.75)])

xlog1py = primitive(jsp.xlog1py)
xlog1py.__doc__ = """x * log1p(y), 0 where x == 0: `jax.scipy.special.xlog1py` with derivatives right at x == 0.

Why a rule: xlog1py(0, y) is 0 for every y, so d/dy is exactly 0 at x == 0, y == -1 too,
where JAX's `x / (1 + y)` is NaN. The value is JAX's.

d/dx = log1p(y): -inf at y == -1 (the true one-sided slope, as `xlogy`'s at y == 0).
d/dy = x / (1 + y), and 0 where x == 0. Strong zeros, as `xlogy`.

Args:
  x: the factor (real; broadcasts with `y`).
  y: the argument, y >= -1.

Returns:
  x log(1 + y), broadcast shape, promoted floating dtype.

>>> import jax
>>> from rules.library.logexp import xlog1py
>>> float(xlog1py(0.0, -1.0)), float(jax.grad(xlog1py, argnums=1)(0.0, -1.0))
(0.0, 0.0)

See also: `xlogy`, `jax.scipy.special.xlog1py`.
"""


# ----- xlogx --------------------------------------------------------------------------------
@primitive
def xlogx(x):
    """x * log(x), 0 at x == 0 (LogExpFunctions.jl's `xlogx`).

    Why a rule: the derivative 1 + log(x) is -inf at 0 (the true one-sided slope), and the
    pullback is a strong zero: a zero cotangent gives exactly 0, never 0 * -inf = NaN.

    That is what the where-trick cannot do. For x^2 log(x) (0 at 0, derivative 0 at 0),
    `jnp.where(x == 0, 0, x**2 * jnp.log(x))` has the gradient NaN at 0 (the unselected
    branch's 0 * log(0)); write `x * xlogx(x)` instead: the cotangent reaching `xlogx` is
    x * y_bar = 0, so `jax.grad` gives 0. Forward mode cannot be right with this idiom:
    `xlogx`'s tangent at 0 is -inf (correctly), and JAX's product rule then multiplies it by
    x = 0 (NaN); for `jax.jvp` / `jax.jacfwd` write `xlogy(x * x, x)` (its frule receives the
    tangent 0 of x * x, a strong zero), whose reverse mode is NaN in turn. One expression
    right in both modes needs its own primitive.

    Args:
      x: the argument, x >= 0 (real floating).

    Returns:
      x log(x), same shape and floating dtype.

    >>> import jax
    >>> from rules.library.logexp import xlogx
    >>> float(xlogx(0.0)), float(jax.grad(xlogx)(0.0)), float(jax.grad(lambda x: x * xlogx(x))(0.0))
    (0.0, -inf, 0.0)

    See also: `xlogy`, `jax.scipy.special.entr` (-x log x).
    """
    x = jnp.asarray(x)
    x = x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.result_type(float))
    return jsp.xlogy(x, x)


def _xlogx_partials(x):
    x = jnp.asarray(x, jnp.result_type(xlogx.fn(x)))
    return (1 + jnp.log(x),)


_strong_rules(xlogx, xlogx.fn, _xlogx_partials, plain=False)
register_examples(xlogx, [(_X + 0.2,), (np.array([0.1, 0.3, 2.0], np.float32),)])  # the slope is -inf at 0


# ----- xexpy --------------------------------------------------------------------------------
@primitive
def xexpy(x, y):
    """x * exp(y), 0 where x == 0 and y is finite (LogExpFunctions.jl's `xexpy`).

    Why a rule: d/dx = exp(y) and d/dy = x exp(y) with strong zeros, so a zero tangent or
    cotangent stays 0 where exp(y) overflows. 0 * exp(inf) stays NaN, as LogExpFunctions has it.

    Args:
      x: the factor (real; broadcasts with `y`).
      y: the exponent.

    Returns:
      x exp(y), broadcast shape, promoted floating dtype.

    >>> from rules.library.logexp import xexpy
    >>> float(xexpy(0.0, 1000.0)), float(xexpy(2.0, 0.0))
    (0.0, 2.0)

    See also: `xlogy`, `exprel`.
    """
    dtype = jnp.result_type(float, x, y)
    x, y = jnp.asarray(x, dtype), jnp.asarray(y, dtype)
    prod = x * jnp.exp(y)
    return jnp.where((x == 0) & jnp.isfinite(y), jnp.zeros_like(prod), prod)


def _xexpy_partials(x, y):
    dtype = jnp.result_type(xexpy.fn(x, y))
    e = jnp.exp(jnp.asarray(y, dtype))
    # d/dy = x exp(y), 0 at x = 0 where exp(y) overflows (as xexpy); not xexpy itself, whose
    # where at x = 0 would cut its own derivative in x (exp(y)) from the Hessian
    return e, jnp.asarray(x, dtype) * jnp.where((x == 0) & jnp.isinf(e) & jnp.isfinite(y), 0, e)


_strong_rules(xexpy, xexpy.fn, _xexpy_partials, plain=False)
register_examples(xexpy, [(_X, _Y - 1.0), (_X32, _Y32)])


# ----- exprel -------------------------------------------------------------------------------
# Below |x| = 1 both the value and the slope are their Taylor series (Horner), above it
# closed forms. Why 1: the closed form of the slope, (e^x - exprel x) / x, cancels ~x/2 out of
# ~1 and loses ~4 eps/|x| relative; at |x| >= 1 that is at most ~4 ulps, while the series
# needs only N terms to be exact to rounding on |x| < 1: the first term left out of the slope,
# (N + 1) x^N / (N + 2)!, is below eps/4 * 1/2 at |x| = 1 for N = 18 in float64 (19/20! = 8e-18)
# and N = 11 in float32 (12/13! = 1.9e-9 < 7.4e-9); the value's series (x^N / (N + 1)!) is
# shorter still, and uses the same N. Measured against 80-digit `decimal` arithmetic on
# +-[1e-12, 700]: value within 1.2 ulps, slope within 2 ulps, in float32 and float64.
_EXPREL_SERIES_BELOW = 1.0
_EXPREL_TERMS = {4: 11, 8: 18}  # by itemsize: float32, float64


def _exprel_terms(dtype: Any) -> int:
    return _EXPREL_TERMS.get(np.dtype(dtype).itemsize, 18)


def _real_float(name: str, x: Any) -> jax.Array:
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(
            format_message(
                f"`rules.library.logexp.{name}`: complex arguments are not supported",
                expected="a real floating or integer argument",
                got=f"dtype {x.dtype}",
                fix="pass the real part, or compute expm1(z) / z directly for complex z",
            )
        )
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.result_type(float))


def _horner(coefficients: list[float], x: jax.Array) -> jax.Array:
    """sum_k coefficients[k] x^k, from the last term."""
    acc = jnp.full_like(x, coefficients[-1])
    for c in coefficients[-2::-1]:
        acc = c + x * acc
    return acc


def _exprel_value(x: jax.Array) -> jax.Array:
    n = _exprel_terms(x.dtype)
    small = jnp.abs(x) < _EXPREL_SERIES_BELOW
    series = _horner([1 / math.factorial(k + 1) for k in range(n + 1)], jnp.where(small, x, jnp.zeros_like(x)))
    # e^x / x where expm1 overflows (x > log(max)), with e^x = e^(x/2)^2 kept finite; the
    # dropped -1/x is below e^-x relative there
    big = x > math.log(float(jnp.finfo(x.dtype).max))
    xl = jnp.where(small, jnp.ones_like(x), x)
    half = jnp.exp(jnp.where(big, xl, jnp.zeros_like(x)) / 2)
    # expm1 only where it is finite: its slope (inf) times a zero cotangent was NaN in reverse mode
    xe = jnp.where(big, jnp.ones_like(x), xl)
    large = jnp.where(big, half * (half / xl), jnp.expm1(xe) / xe)
    return jnp.where(small, series, large)


def _exprel_slope(x: jax.Array) -> jax.Array:
    """d/dx exprel(x) = (x e^x - expm1 x) / x^2, 1/2 at 0."""
    n = _exprel_terms(x.dtype)
    small = jnp.abs(x) < _EXPREL_SERIES_BELOW
    coefficients = [(k + 1) / math.factorial(k + 2) for k in range(n)]  # of x^k: (k + 1) / (k + 2)!
    series = _horner(coefficients, jnp.where(small, x, jnp.zeros_like(x)))
    xl = jnp.where(small, jnp.ones_like(x), x)
    pos = xl > 0
    # x >= 1: exprel(x) (x - 1) / x + 1 / x, both terms positive, finite as far as exprel is;
    # x <= -1: (x e^x - expm1 x) / x / x, no cancellation worse than a factor 4 (at x = -1)
    right = _exprel_value(jnp.where(pos, xl, jnp.ones_like(x))) * ((xl - 1) / xl) + 1 / xl
    left_x = jnp.where(pos, -jnp.ones_like(x), xl)
    left = (left_x * jnp.exp(left_x) - jnp.expm1(left_x)) / left_x / left_x
    return jnp.where(small, series, jnp.where(pos, right, left))


@primitive(examples=[(np.array([-30.0, -1.5, -0.2, 0.0, 1e-9, 0.6, 4.0, 710.0]),), (np.array([-2.0, 0.0, 0.3, 5.0], np.float32),)])
def exprel(x):
    """Relative error exponential, expm1(x) / x, and 1 at x == 0 (SciPy's `exprel`).

    Why a rule: JAX has no exprel, and the where-trick
    `jnp.where(x == 0, 1.0, jnp.expm1(x) / x)` has the gradient NaN at 0 (its unselected
    branch). Here the value and the slope (x e^x - expm1 x) / x^2 (1/2 at 0) are Taylor
    series for |x| < 1 and closed forms without cancellation beyond (see the comment above
    `_EXPREL_SERIES_BELOW`): within a few ulps in float32 and float64, also where expm1(x)
    overflows but expm1(x) / x does not (709.8 < x < 716 in float64). The frule's slope is
    plain JAX code with safe branches, so second derivatives are right too (1/3 at 0).

    Args:
      x: the argument (real).

    Returns:
      expm1(x) / x, same shape, floating dtype of `x`.

    Raises:
      TypeError: complex `x`.

    >>> import jax
    >>> from rules.library.logexp import exprel
    >>> float(exprel(0.0)), float(jax.grad(exprel)(0.0)), float(jax.grad(jax.grad(exprel))(0.0))
    (1.0, 0.5, 0.333...)

    See also: `jax.numpy.expm1`, `scipy.special.exprel`.
    """
    return _exprel_value(_real_float("exprel", x))


@exprel.frule
def exprel_frule(tangents, x):
    _, x_dot = tangents
    x = _real_float("exprel", x)
    y = _exprel_value(x)
    x_dot = unthunk(x_dot)
    if isinstance(x_dot, AbstractZero):
        return y, ZeroTangent()
    return y, _exprel_slope(x) * jnp.asarray(x_dot, y.dtype)


# ----- logsumexp with weights ---------------------------------------------------------------
def _lse_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    return tuple(sorted(a % ndim for a in ((axis,) if isinstance(axis, int) else axis)))


def _lse_weights(a: jax.Array, y_kept: jax.Array) -> jax.Array:
    """exp(a - y): d y / d b. Where y is -inf: inf (b = 0 there, and the sum grows from 0),
    and 0 for an a of -inf too (an empty row, as the library's `nn.logsumexp`)."""
    empty = jnp.isneginf(y_kept) & jnp.isneginf(a)
    return jnp.where(empty, 0.0, jnp.exp(jnp.where(empty, 0.0, a - y_kept)))


def _lse_value(a: jax.Array, b: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """JAX's `logsumexp(a, b=b)` (kept dims), its value bit for bit, with derivatives right where
    b == 0 (JAX drops those terms, so its d/db_i, and the partials' derivatives, are 0 there).

    Where that value y0 is finite, y = y0 + (log(S) - log(S)) with S = sum(b exp(a - y0)) and y0
    held: log(sum(b exp(a))) up to a constant, so every derivative is the truth. Elsewhere
    (an empty sum, an inf, a negative sum): JAX's own, as before."""
    y0 = jsp.logsumexp(a, axis=axes, b=b, keepdims=True)
    finite = jnp.isfinite(y0)
    c = jax.lax.stop_gradient(jnp.where(finite, y0, 0.0))
    # b == 0 at a == inf: JAX's value drops the term (0 * inf would be nan), and so does this
    keep = ~((b == 0) & jnp.isposinf(a))
    terms = jnp.where(keep, b * jnp.exp(jnp.where(keep, a - c, 0.0)), 0.0)
    s = jnp.sum(terms, axis=axes, keepdims=True)
    s = jnp.where(finite, s, 1.0)  # safe where unused: no inf * 0 in the unselected branch
    log_s = jnp.log(s)
    return jnp.where(finite, c + (log_s - jax.lax.stop_gradient(log_s)), y0)  # c + 0: y0 exactly


@primitive(examples=[(np.array([[0.0, 0.7, -1.0], [2.0, 0.3, 0.1]]), np.array([[1.0, 0.0, 2.0], [0.5, 1.0, 0.0]]), 1),
                     (np.array([0.5, -0.2, 1.0], np.float32), np.array([0.0, 1.0, 3.0], np.float32))])  # fmt: skip
def weighted_logsumexp(a, b, axis=None, keepdims=False):
    """log(sum(b * exp(a))) over `axis`, the weighted form of `jax.scipy.special.logsumexp`.

    Why a rule: JAX's derivative in b is 0 where b == 0 (it drops those terms before the sum),
    but the sum grows there: d/db_i = exp(a_i - y), which the pullback gives; d/da_i =
    b_i exp(a_i - y). `logsumexp(a, b=b)` of this module (JAX's signature) calls it.

    Args:
      a: the exponents.
      b: the weights (>= 0), broadcasting with `a`.
      axis: None (every axis), an int or a tuple of ints.
      keepdims: keep the reduced axes with size 1.

    Returns:
      The weighted log-sum-exp over `axis`.

    >>> import jax, jax.numpy as jnp
    >>> a, b = jnp.log(jnp.array([1.0, 2.0, 4.0])), jnp.array([1.0, 1.0, 0.0])
    >>> jax.grad(weighted_logsumexp, argnums=1)(a, b).round(6).tolist()   # JAX: [0.333333, 0.666667, 0.0]
    [0.333333, 0.666667, 1.333333]

    See also: `logsumexp`, `rules.library.nn.logsumexp`.
    """
    return jsp.logsumexp(a, axis=axis, b=b, keepdims=keepdims)


@weighted_logsumexp.rrule
def weighted_logsumexp_rrule(a, b, *options, **kw_options):
    axis, keepdims = (list(options) + [None, False][len(options):])[:2]
    axis, keepdims = kw_options.get("axis", axis), kw_options.get("keepdims", keepdims)
    project_a, project_b = ProjectTo(a), ProjectTo(b)
    a_, b_ = jnp.broadcast_arrays(jnp.asarray(a), jnp.asarray(b))
    axes = _lse_axes(axis, a_.ndim)
    y = _lse_value(a_, b_, axes)
    w = _lse_weights(a_, y)

    def weighted_logsumexp_pullback(y_bar):
        y_bar = unthunk(y_bar)
        if isinstance(y_bar, AbstractZero):
            return (NoTangent(), ZeroTangent(), ZeroTangent()) + (NoTangent(),) * len(options)
        y_bar = jnp.asarray(y_bar) if keepdims else jnp.expand_dims(y_bar, axes)
        b_bar = _unbroadcast(y_bar * w, jnp.shape(b))
        a_bar = _unbroadcast(y_bar * b_ * w, jnp.shape(a))
        return (NoTangent(), project_a(a_bar), project_b(b_bar)) + (NoTangent(),) * len(options)

    return (y if keepdims else jnp.squeeze(y, axes)), weighted_logsumexp_pullback


def logsumexp(a, axis=None, b=None, keepdims=False, return_sign=False, where=None):
    """`jax.scipy.special.logsumexp` (JAX's signature and values), whose derivative in `b` is
    right where b == 0 (JAX's: 0; true: exp(a_i - y)).

    With `b` and neither `return_sign` nor `where`, this is `weighted_logsumexp`; otherwise
    JAX's own function (its derivatives are right there, or the same as JAX's: with
    `return_sign` or `where` and a zero weight, d/db is JAX's 0).

    >>> import jax, jax.numpy as jnp
    >>> a = jnp.zeros(3)
    >>> jax.grad(lambda b: logsumexp(a, b=b))(jnp.array([1.0, 1.0, 0.0])).tolist()
    [0.5, 0.5, 0.5]

    See also: `weighted_logsumexp`, `jax.scipy.special.logsumexp`.
    """
    if b is None or return_sign or where is not None:
        return jsp.logsumexp(a, axis=axis, b=b, keepdims=keepdims, return_sign=return_sign, where=where)
    return weighted_logsumexp(a, b, axis, keepdims)
