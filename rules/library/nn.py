"""Neural-network functions: reductions, losses and activations.

Each function is a `primitive` whose rrule is the fused, numerically stable pullback that
plain JAX autodiff of the textbook formula does not give: finite gradients where the formula
overflows or meets `-inf - -inf`, one pass instead of a chain of small ops (layer norm and
attention are in `nn_layers`). Static parameters (`axis`, `approximate`) get
`NoTangent()`; a pullback returns one cotangent per positional argument actually passed.
logsumexp, softmax and log_softmax also have frules (forward mode in one pass, finite on
fully masked rows); the other functions get forward mode by transposing their pullbacks.
The numerics live in small jitted kernels: an eager call (or pullback) is one compiled
program instead of a dozen op-by-op dispatches; under a trace they are inlined.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._helpers import _unbroadcast, scalar_rule
from .._primitive import primitive
from .._projection import ProjectTo, is_differentiable_leaf
from .._thunks import thunk, unthunk
from .._zeros import AbstractZero, NoTangent, ZeroTangent
from .elementwise import _sigmoid

__all__ = [
    "logsumexp",
    "softmax",
    "log_softmax",
    "softmax_cross_entropy",
    "sparse_softmax_cross_entropy",
    "sigmoid_binary_cross_entropy",
    "softplus",
    "log_sigmoid",
    "gelu",
    "squareplus",
    "mse",
]

# Example inputs (small; float64 unless named *32), one shape where possible (fewer compiles).
_M = np.array([[0.5, -1.0, 2.0], [1.5, 0.2, -0.3]])
_M32 = _M.astype(np.float32)
_T = np.array([[0.2, 0.5, 0.3], [0.0, 1.0, 0.0]])  # rows of probabilities
_B = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.3]])  # binary targets (and a soft one)
_S, _O = np.array([0.7, -1.2, 2.0]), np.array([0.1, 0.4, -0.5])  # layer_norm scale, offset

_kernel = functools.partial(jax.jit, static_argnames=("axes",))


# ----- shared helpers -----------------------------------------------------------------------
def _bind(fn: Callable, args: tuple, kwargs: dict) -> list:
    """The call's arguments in `fn`'s parameter order, defaults filled in."""
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return list(bound.arguments.values())


def _cotangents(args: tuple, *per_parameter: Any) -> tuple:
    """(f_bar, ...): one cotangent per positional argument passed; NoTangent past the list."""
    cts = list(per_parameter[: len(args)]) + [NoTangent()] * max(0, len(args) - len(per_parameter))
    return (NoTangent(), *cts)


def _axes(axis: int | tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted(a % ndim for a in axis))


def _maybe(x: Any, make: Callable[[], Any]) -> Any:
    """A lazy cotangent for a differentiable `x`; NoTangent for ints, bools and None."""
    return thunk(make) if x is not None and is_differentiable_leaf(x) else NoTangent()


def _zero(x: Any) -> Any:
    """The cotangent of `x` for a zero seed: ZeroTangent, or NoTangent if x cannot be perturbed."""
    return ZeroTangent() if x is not None and is_differentiable_leaf(x) else NoTangent()


def _normalise(x, axes):
    """(x - shift, sum(exp(x - shift)), shift) over `axes` (kept): what every softmax is made of.

    The shift is the maximum clamped to the finite floats, so an all -inf row (a fully masked
    one) shifts by the lowest float and stays -inf, total 0, instead of giving -inf - -inf.
    Clamps rather than `where`s, because XLA on CPU fuses max, exp, sums and the pullback into
    one loop and a select splits that loop in five; `-max(-m, lo)` spells `min(m, -lo)` since
    XLA would merge min(max) into a clamp, which splits it too.
    """
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(float)
    lowest = jnp.finfo(x.dtype).min
    top = jnp.max(x, axis=axes, keepdims=True)
    shift = jax.lax.stop_gradient(-jnp.maximum(-jnp.maximum(top, lowest), lowest))  # the results do not depend on it
    shifted = x - shift
    return shifted, jnp.sum(jnp.exp(shifted), axis=axes, keepdims=True), shift


def _nonzero(total):
    """`total`, or 1/2 on an all -inf row (total 0), whose probabilities then stay 0 and log-probabilities -inf.

    Every other row's maximum adds exp(0) = 1, so its total is >= 1 and the floor neither binds
    nor ties (a tie would halve the derivative of `maximum` in second derivatives).
    """
    return jnp.maximum(total, 0.5)


def _log_probabilities(shifted, total):
    return shifted - jnp.log(_nonzero(total))


@_kernel
def _logsumexp_and_pieces(x, axes):
    shifted, total, shift = _normalise(x, axes)
    return jnp.squeeze(shift + jnp.log(total), axis=axes), shifted, total


@_kernel
def _softmax(x, axes):
    shifted, total, _ = _normalise(x, axes)
    return jnp.exp(shifted) / _nonzero(total)


@_kernel
def _log_softmax_and_pieces(x, axes):
    shifted, total, _ = _normalise(x, axes)
    return _log_probabilities(shifted, total), shifted, total


@jax.jit
def _softmax_times(shifted, total, scale):
    """softmax * scale for a per-row `scale`: the exponentials the forward pass summed, reused."""
    return jnp.exp(shifted) * (scale / _nonzero(total))


@_kernel
def _softmax_back(y, y_bar, axes):
    return y * (y_bar - jnp.sum(y_bar * y, axis=axes, keepdims=True))


@_kernel
def _log_softmax_back(shifted, total, y_bar, axes):
    return y_bar + _softmax_times(shifted, total, -jnp.sum(y_bar, axis=axes, keepdims=True))


def _tangent_of(tangents: tuple, x: Any) -> Any:
    """x_dot, the tangent of the first argument (None for a zero one), projected onto x."""
    x_dot = unthunk(tangents[1])
    return None if isinstance(x_dot, AbstractZero) else ProjectTo(x)(x_dot)


@_kernel
def _softmax_mean(shifted, total, x_dot, axes):
    """sum(softmax * x_dot) over `axes` (kept): the tangent of logsumexp; 0 on all -inf rows."""
    return jnp.sum(_softmax_times(shifted, total, 1.0) * jnp.where(jnp.isneginf(shifted), 0.0, x_dot), axis=axes,
                   keepdims=True)


# ----- logsumexp ----------------------------------------------------------------------------
@primitive(examples=[(_M,), (_M32, 0)])
def logsumexp(x, axis=-1):
    """log(sum(exp(x))) over `axis`, without overflow; -inf (gradient 0) for all -inf rows.

    Why a rule: autodiff of the shifted formula (and of `jax.nn.logsumexp`) gives NaN
    gradients for a row that is entirely -inf (a fully masked row); this rule gives 0 there.

    Args:
      x: real array.
      axis: int, tuple of ints, or None (all axes); these axes are reduced.

    Returns:
      The log-sum-exp, with the reduced axes removed.

    >>> import jax, jax.numpy as jnp
    >>> x = jnp.array([[-jnp.inf, -jnp.inf], [0.0, jnp.log(3.0)]])
    >>> logsumexp(x).round(4).tolist()
    [-inf, 1.3863]
    >>> jax.grad(lambda x: logsumexp(x)[1] + logsumexp(x)[0])(x).round(2).tolist()
    [[0.0, 0.0], [0.25, 0.75]]

    See also: `softmax`, `log_softmax`, `jax.nn.logsumexp`.
    """
    return _logsumexp_and_pieces(x, axes=_axes(axis, jnp.ndim(x)))[0]


@logsumexp.rrule
def logsumexp_rrule(*args, **kwargs):
    x, axis = _bind(logsumexp.fn, args, kwargs)
    axes = _axes(axis, jnp.ndim(x))
    project_x = ProjectTo(x)
    y, shifted, total = _logsumexp_and_pieces(x, axes=axes)

    def logsumexp_pullback(y_bar):
        y_bar = unthunk(y_bar)
        if isinstance(y_bar, AbstractZero):
            return _cotangents(args, ZeroTangent())
        return _cotangents(args, project_x(_softmax_times(shifted, total, jnp.expand_dims(y_bar, axes))))

    return y, logsumexp_pullback


def _frule_through_softmax_mean(prim, pieces, finish, tangents, args, kwargs):
    """(y, finish(x_dot, sum(softmax * x_dot) kept over axes, axes)): the frules of logsumexp
    and log_softmax, whose `pieces(x, axes)` give (y, shifted, total)."""
    x, axis = _bind(prim.fn, args, kwargs)
    axes = _axes(axis, jnp.ndim(x))
    y, shifted, total = pieces(x, axes=axes)
    x_dot = _tangent_of(tangents, x)
    if x_dot is None:
        return y, ZeroTangent()
    return y, finish(x_dot, _softmax_mean(shifted, total, x_dot, axes=axes), axes)


@logsumexp.frule
def logsumexp_frule(tangents, *args, **kwargs):
    return _frule_through_softmax_mean(logsumexp, _logsumexp_and_pieces, lambda x_dot, mean, axes: jnp.squeeze(mean, axis=axes),
                                       tangents, args, kwargs)


# ----- softmax ------------------------------------------------------------------------------
@primitive(examples=[(_M,), (_M32, 0)])
def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) over `axis`, computed stably; all -inf rows give zeros.

    Why a rule: the pullback `y * (y_bar - sum(y_bar * y))` needs only the output, where
    autodiff of the formula saves its intermediates; it is finite for logits where the
    naive `exp(x) / sum(exp(x))` overflows, and 0 (not NaN) on fully masked rows.

    Args:
      x: real array.
      axis: int, tuple of ints or None: the axes normalised over.

    Returns:
      Probabilities of x's shape, summing to 1 over `axis` (0 on rows that are all -inf).

    >>> import jax.numpy as jnp
    >>> softmax(jnp.array([1000.0, 1000.0 + jnp.log(3.0)])).round(4).tolist()
    [0.25, 0.75]

    See also: `log_softmax`, `logsumexp`, `jax.nn.softmax`.
    """
    return _softmax(x, axes=_axes(axis, jnp.ndim(x)))


@softmax.rrule
def softmax_rrule(*args, **kwargs):
    x, axis = _bind(softmax.fn, args, kwargs)
    axes = _axes(axis, jnp.ndim(x))
    project_x = ProjectTo(x)
    y = softmax.fn(x, axis)

    def softmax_pullback(y_bar):
        y_bar = unthunk(y_bar)
        if isinstance(y_bar, AbstractZero):
            return _cotangents(args, ZeroTangent())
        return _cotangents(args, project_x(_softmax_back(y, y_bar, axes=axes)))

    return y, softmax_pullback


@softmax.frule
def softmax_frule(tangents, *args, **kwargs):
    x, axis = _bind(softmax.fn, args, kwargs)
    axes = _axes(axis, jnp.ndim(x))
    y = softmax.fn(x, axis)
    x_dot = _tangent_of(tangents, x)
    if x_dot is None:
        return y, ZeroTangent()
    return y, _softmax_back(y, jnp.where(y == 0, 0.0, x_dot), axes=axes)  # the Jacobian is symmetric


# ----- log_softmax --------------------------------------------------------------------------
@primitive(examples=[(_M,), (_M32, 0)])
def log_softmax(x, axis=-1):
    """x - logsumexp(x) over `axis`: log-probabilities, stable for large logits.

    Why a rule: the fused pullback `y_bar - softmax(x) * sum(y_bar)` is finite for rows
    with -inf entries (masked classes) and for all -inf rows, where `jax.nn.log_softmax`
    gives NaN values and gradients.

    Args:
      x: real array.
      axis: int, tuple of ints or None: the axes normalised over.

    Returns:
      Log-probabilities of x's shape (-inf on rows that are all -inf).

    >>> import jax.numpy as jnp
    >>> log_softmax(jnp.array([0.0, jnp.log(3.0)])).round(4).tolist()
    [-1.3863, -0.2877]

    See also: `softmax`, `logsumexp`, `jax.nn.log_softmax`.
    """
    return _log_softmax_and_pieces(x, axes=_axes(axis, jnp.ndim(x)))[0]


@log_softmax.rrule
def log_softmax_rrule(*args, **kwargs):
    x, axis = _bind(log_softmax.fn, args, kwargs)
    axes = _axes(axis, jnp.ndim(x))
    project_x = ProjectTo(x)
    y, shifted, total = _log_softmax_and_pieces(x, axes=axes)

    def log_softmax_pullback(y_bar):
        y_bar = unthunk(y_bar)
        if isinstance(y_bar, AbstractZero):
            return _cotangents(args, ZeroTangent())
        return _cotangents(args, project_x(_log_softmax_back(shifted, total, y_bar, axes=axes)))

    return y, log_softmax_pullback


@log_softmax.frule
def log_softmax_frule(tangents, *args, **kwargs):
    return _frule_through_softmax_mean(log_softmax, _log_softmax_and_pieces, lambda x_dot, mean, axes: x_dot - mean,
                                       tangents, args, kwargs)


# ----- softmax_cross_entropy ----------------------------------------------------------------
@jax.jit
def _cross_entropy(logits, onehot):
    shifted, total, _ = _normalise(logits, (jnp.ndim(logits) - 1,))
    logp = _log_probabilities(shifted, total)
    return -jnp.sum(jnp.where(onehot == 0, 0.0, onehot * logp), axis=-1), shifted, total


@jax.jit
def _cross_entropy_back(y_bar, shifted, total, onehot):
    y_bar = y_bar[..., None]
    return _softmax_times(shifted, total, y_bar * jnp.sum(onehot, axis=-1, keepdims=True)) + onehot * -y_bar


@jax.jit
def _cross_entropy_onehot_back(y_bar, shifted, total):
    return -y_bar[..., None] * _log_probabilities(shifted, total)


@primitive(examples=[(_M, _T), (_M32, _T.astype(np.float32))])
def softmax_cross_entropy(logits, onehot):
    """Per-example cross-entropy -sum(onehot * log_softmax(logits)) over the last axis.

    Why a rule: the fused pullback `y_bar * (softmax(logits) * sum(onehot) - onehot)` (the
    familiar `softmax - onehot`) is finite for logits so large that the naive formula
    overflows, and saves one array instead of the chain of intermediates.

    Args:
      logits: real array (..., classes).
      onehot: target probabilities of the same shape (one-hot or soft labels).

    Returns:
      The loss per example, shape `logits.shape[:-1]`.

    >>> import jax, jax.numpy as jnp
    >>> logits, onehot = jnp.array([[1e4, 0.0]]), jnp.array([[0.0, 1.0]])
    >>> softmax_cross_entropy(logits, onehot).tolist()
    [10000.0]
    >>> jax.grad(lambda l: softmax_cross_entropy(l, onehot).sum())(logits).tolist()
    [[1.0, -1.0]]

    See also: `sparse_softmax_cross_entropy`, `log_softmax`.
    """
    return _cross_entropy(logits, onehot)[0]


@softmax_cross_entropy.rrule
def softmax_cross_entropy_rrule(logits, onehot):
    project_logits, project_onehot = ProjectTo(logits), ProjectTo(onehot)
    y, shifted, total = _cross_entropy(logits, onehot)

    def softmax_cross_entropy_pullback(y_bar):
        y_bar = unthunk(y_bar)
        if isinstance(y_bar, AbstractZero):
            return NoTangent(), ZeroTangent(), _zero(onehot)
        logits_bar = thunk(lambda: project_logits(_cross_entropy_back(y_bar, shifted, total, onehot)))
        onehot_bar = _maybe(onehot, lambda: project_onehot(_cross_entropy_onehot_back(y_bar, shifted, total)))
        return NoTangent(), logits_bar, onehot_bar

    return y, softmax_cross_entropy_pullback


# ----- sparse_softmax_cross_entropy ---------------------------------------------------------
@jax.jit
def _sparse_cross_entropy(logits, labels):
    shifted, total, shift = _normalise(logits, (jnp.ndim(logits) - 1,))
    picked = jnp.take_along_axis(logits, labels[..., None], axis=-1) - shift  # shifted[label], read from the input
    return (jnp.log(_nonzero(total)) - picked)[..., 0], shifted, total


@jax.jit
def _sparse_cross_entropy_back(y_bar, shifted, total, labels):
    """y_bar * (softmax - onehot(labels)): one pass, then y_bar subtracted in place at the labels."""
    g = _softmax_times(shifted, total, y_bar[..., None])
    at_labels = (*jnp.indices(labels.shape, sparse=True), labels)
    return g.at[at_labels].add(-y_bar.astype(g.dtype), mode="drop")


@primitive(examples=[(_M, np.array([2, 0])), (_M32, np.array([1, 1], np.int32))])
def sparse_softmax_cross_entropy(logits, labels):
    """Per-example cross-entropy with integer class labels: -log_softmax(logits)[label].

    Why a rule: the pullback `softmax(logits) - onehot(labels)` is formed in one pass, is
    finite for huge logits, and gives the integer labels `NoTangent()` (not a float zero).

    Args:
      logits: real array (..., classes).
      labels: int array of shape `logits.shape[:-1]`, values in [0, classes).

    Returns:
      The loss per example, shape `labels.shape`.

    >>> import jax.numpy as jnp
    >>> sparse_softmax_cross_entropy(jnp.array([[0.0, jnp.log(3.0)]]), jnp.array([1])).round(4).tolist()
    [0.2877]

    See also: `softmax_cross_entropy`, `logsumexp`.
    """
    return _sparse_cross_entropy(logits, labels)[0]


@sparse_softmax_cross_entropy.rrule
def sparse_softmax_cross_entropy_rrule(logits, labels):
    project_logits = ProjectTo(logits)
    y, shifted, total = _sparse_cross_entropy(logits, labels)

    def sparse_softmax_cross_entropy_pullback(y_bar):
        y_bar = unthunk(y_bar)
        if isinstance(y_bar, AbstractZero):
            return NoTangent(), ZeroTangent(), NoTangent()
        return NoTangent(), project_logits(_sparse_cross_entropy_back(y_bar, shifted, total, labels)), NoTangent()

    return y, sparse_softmax_cross_entropy_pullback


# ----- sigmoid_binary_cross_entropy ---------------------------------------------------------
@jax.jit
def _softplus(x):
    return jnp.maximum(x, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(x)))


@jax.jit
def _sigmoid_times(y_bar, x, sign):
    return y_bar * _sigmoid(sign * x)  # sigmoid's rule: its slope s(x) s(-x) is right in the tails


@primitive(examples=[(_M, _B), (_M32, _B.astype(np.float32))])
def sigmoid_binary_cross_entropy(logits, labels):
    """Elementwise -labels*log(sigmoid(logits)) - (1-labels)*log(1-sigmoid(logits)), stably.

    Why a rule: written as `softplus(logits) - logits * labels` it is exact for any |logits|;
    the naive formula gives inf loss and NaN gradients once sigmoid rounds to 0 or 1. The
    pullback `sigmoid(logits) - labels` is fused.

    Args:
      logits: real array.
      labels: targets in [0, 1], same shape (or broadcastable, same rank).

    Returns:
      The elementwise loss (broadcast shape).

    >>> import jax, jax.numpy as jnp
    >>> float(sigmoid_binary_cross_entropy(jnp.array(-40.0), jnp.array(1.0)))
    40.0
    >>> float(jax.grad(sigmoid_binary_cross_entropy)(jnp.array(-40.0), jnp.array(1.0)))
    -1.0

    See also: `softplus`, `log_sigmoid`, `softmax_cross_entropy`.
    """
    return _softplus(logits) - logits * labels


@sigmoid_binary_cross_entropy.rrule
def sigmoid_binary_cross_entropy_rrule(logits, labels):
    project_logits, project_labels = ProjectTo(logits), ProjectTo(labels)
    y = sigmoid_binary_cross_entropy.fn(logits, labels)

    def sigmoid_binary_cross_entropy_pullback(y_bar):
        y_bar = unthunk(y_bar)
        if isinstance(y_bar, AbstractZero):
            return NoTangent(), ZeroTangent(), _zero(labels)
        logits_bar = thunk(
            lambda: project_logits(_unbroadcast(_sigmoid_times(y_bar, logits, 1.0) - y_bar * labels, jnp.shape(logits)))
        )
        labels_bar = _maybe(labels, lambda: project_labels(_unbroadcast(-y_bar * logits, jnp.shape(labels))))
        return NoTangent(), logits_bar, labels_bar

    return y, sigmoid_binary_cross_entropy_pullback


# ----- softplus -----------------------------------------------------------------------------
@primitive(examples=[(_M,), (_M32,)])
def softplus(x):
    """log(1 + exp(x)), exact for any x: max(x, 0) + log1p(exp(-|x|)).

    Why a rule: the naive formula overflows to inf for x > ~710 (float64); the pullback
    `y_bar * sigmoid(x)` is one op and finite everywhere.

    Args:
      x: real array.

    Returns:
      softplus(x), of x's shape.

    >>> import jax
    >>> float(softplus(1000.0)), float(jax.grad(softplus)(1000.0))
    (1000.0, 1.0)

    See also: `log_sigmoid`, `sigmoid_binary_cross_entropy`, `jax.nn.softplus`.
    """
    return _softplus(x)


@softplus.rrule
def softplus_rrule(x):
    project_x = ProjectTo(x)

    def softplus_pullback(y_bar):
        return NoTangent(), project_x(_sigmoid_times(unthunk(y_bar), x, 1.0))

    return _softplus(x), softplus_pullback


# ----- log_sigmoid --------------------------------------------------------------------------
@primitive(examples=[(_M,), (_M32,)])
def log_sigmoid(x):
    """log(sigmoid(x)) = -softplus(-x), exact for any x.

    Why a rule: the naive `log(sigmoid(x))` is -inf with a NaN gradient once sigmoid(x)
    underflows (x < ~-745 in float64, ~-104 in float32); the pullback `y_bar * sigmoid(-x)`
    is finite.

    Args:
      x: real array.

    Returns:
      log(sigmoid(x)), of x's shape.

    >>> import jax
    >>> float(log_sigmoid(-1000.0)), float(jax.grad(log_sigmoid)(-1000.0))
    (-1000.0, 1.0)

    See also: `softplus`, `jax.nn.log_sigmoid`.
    """
    return -_softplus(-x)


@log_sigmoid.rrule
def log_sigmoid_rrule(x):
    project_x = ProjectTo(x)

    def log_sigmoid_pullback(y_bar):
        return NoTangent(), project_x(_sigmoid_times(unthunk(y_bar), x, -1.0))

    return -_softplus(-x), log_sigmoid_pullback


# ----- squareplus ---------------------------------------------------------------------------
def _squareplus_root(x, b):
    """sqrt(x**2 + b) without squaring x: x**2 overflows float32 at 1e20."""
    return jnp.hypot(x, jnp.sqrt(jnp.asarray(b, jnp.result_type(x, float))))


@primitive(examples=[(_M,), (_M32, np.float32(0.5))])
def squareplus(x, b=4):
    """(x + sqrt(x**2 + b)) / 2, as `jax.nn.squareplus`, finite where x**2 overflows.

    Why a rule: JAX before 0.12.1 squares x, so float32 `squareplus(1e20)` is inf with slope
    1/2 (true: 1e20 and 1). Here the root is a hypotenuse, the negative side is b / (2 (r - x)) (no
    cancellation), and the partials are d/dx = (1 + x / r) / 2, d/db = 1 / (4 r).

    Args:
      x: real array.
      b: the smoothing parameter (> 0), a number or an array that broadcasts with x.

    Returns:
      squareplus(x, b), of the broadcast shape.

    >>> import jax, numpy as np
    >>> x = np.float32(1e20)
    >>> float(squareplus(x)), float(jax.grad(squareplus)(x))
    (1e+20, 1.0)

    See also: `softplus`, `jax.nn.squareplus`.
    """
    r = _squareplus_root(x, b)
    return jnp.where(x < 0, b / (2 * (r - x)), (x + r) / 2)


def _squareplus_partials(x, *b_and_y):
    b = b_and_y[0] if len(b_and_y) == 2 else 4
    r = _squareplus_root(x, b)
    dx = jnp.where(x < 0, b / (2 * r * (r - x)), (1 + x / r) / 2)  # (r + x) / (2 r) without cancelling
    return (dx, 1 / (4 * r)) if len(b_and_y) == 2 else dx


scalar_rule(squareplus, _squareplus_partials)


# ----- gelu ---------------------------------------------------------------------------------
_SQRT_HALF, _INV_SQRT_2PI = math.sqrt(0.5), 1 / math.sqrt(2 * math.pi)
_GELU_C, _GELU_A = math.sqrt(2 / math.pi), 0.044715
_GELU_BIG = 100.0  # beyond |x| = 100 the tanh form's curvature term is exactly 0


@functools.partial(jax.jit, static_argnames=("approximate",))
def _gelu_and_slope(x, approximate):
    """(gelu(x), d gelu / dx). The tanh form as x * sigmoid(2u), u = c (x + a x^3)."""
    if approximate:
        s = jax.nn.sigmoid(2 * _GELU_C * (x + _GELU_A * x * x * x))
        small = jnp.abs(x) < _GELU_BIG  # past it s (1 - s) == 0 but x^3 may overflow: 0 * inf
        xs = jnp.where(small, x, 0.0)
        return x * s, s + jnp.where(small, 2 * xs * s * (1 - s) * _GELU_C * (1 + 3 * _GELU_A * xs * xs), 0.0)
    cdf = 0.5 * jax.scipy.special.erfc(-x * _SQRT_HALF)
    return x * cdf, cdf + x * _INV_SQRT_2PI * jnp.exp(-0.5 * x * x)


@primitive(examples=[(_M,), (_M32, True)])
def gelu(x, approximate=False):
    """Gaussian error linear unit x * Phi(x); `approximate=True` is the tanh form.

    Why a rule: the pullback is one fused expression, and the tanh form is written as
    `x * sigmoid(2u)` instead of `x * (1 + tanh(u)) / 2`, so it keeps its relative accuracy
    in the negative tail (where `jax.nn.gelu` rounds to 0) and its gradient stays finite for
    huge |x| (where autodiff of the cubic gives 0 * inf = NaN).
    Note the default is the exact form (`jax.nn.gelu` defaults to the tanh form).

    Args:
      x: real array.
      approximate: static bool: tanh approximation instead of the exact erfc form.

    Returns:
      gelu(x), of x's shape.

    >>> import jax
    >>> round(float(gelu(1.0)), 6), round(float(jax.grad(gelu)(1.0)), 6)
    (0.841345, 1.083315)
    >>> float(gelu(-9.0, True)) < 0.0, float(jax.nn.gelu(-9.0, approximate=True))
    (True, -0.0)

    See also: `jax.nn.gelu`, `softplus`.
    """
    return _gelu_and_slope(x, approximate=bool(approximate))[0]


@gelu.rrule
def gelu_rrule(*args, **kwargs):
    x, approximate = _bind(gelu.fn, args, kwargs)
    project_x = ProjectTo(x)
    y, slope = _gelu_and_slope(x, approximate=bool(approximate))

    def gelu_pullback(y_bar):
        return _cotangents(args, project_x(unthunk(y_bar) * slope))

    return y, gelu_pullback


# ----- mse ----------------------------------------------------------------------------------
@primitive(examples=[(_M, _M[::-1]), (_M + 1j * _M[::-1], _T - 0.5j)])
def mse(y_hat, y):
    """Mean squared error mean(|y_hat - y|^2) over all elements (a real scalar).

    Why a rule: the pullback `2 (y_hat - y) / N` saves one difference array, reduces over
    broadcast dimensions, gives complex inputs ChainRules' cotangent, and gives integer
    targets `NoTangent()`.

    Args:
      y_hat: predictions (real or complex array).
      y: targets, same shape (or broadcastable, same rank).

    Returns:
      The mean squared error, a scalar.

    >>> import jax, jax.numpy as jnp
    >>> float(mse(jnp.array([1.0, 3.0]), jnp.array([0.0, 0.0])))
    5.0
    >>> jax.grad(mse)(jnp.array([1.0, 3.0]), jnp.array([0.0, 0.0])).tolist()
    [1.0, 3.0]

    See also: `sigmoid_binary_cross_entropy`, `softmax_cross_entropy`.
    """
    d = y_hat - y
    return jnp.mean(jnp.real(d * jnp.conj(d)))


@mse.rrule
def mse_rrule(y_hat, y):
    # the seed is named loss_bar here: y_bar would read as the cotangent of the target y
    project_y_hat, project_y = ProjectTo(y_hat), ProjectTo(y)
    d = y_hat - y
    loss = jnp.mean(jnp.real(d * jnp.conj(d)))

    def mse_pullback(loss_bar):
        loss_bar = unthunk(loss_bar)
        if isinstance(loss_bar, AbstractZero):
            return NoTangent(), _zero(y_hat), _zero(y)
        g = (2 / np.size(d)) * jnp.real(loss_bar) * d  # dL/dRe + i dL/dIm
        y_hat_bar = _maybe(y_hat, lambda: project_y_hat(_unbroadcast(g, jnp.shape(y_hat))))
        y_bar = _maybe(y, lambda: project_y(_unbroadcast(-g, jnp.shape(y))))
        return NoTangent(), y_hat_bar, y_bar

    return loss, mse_pullback
