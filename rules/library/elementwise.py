"""Elementwise functions of `jax.numpy` and `jax.nn`: rules from partial derivatives.

Each line is ChainRules' `@scalar_rule`: the partials, written with the output `y` where that
is cheaper, keyed on the JAX function itself so that `rules.rrule(jnp.sin, x)` answers as
ChainRules' `rrule(sin, x)` does and `rrule_via_ad` compositions use them. The examples are
what `python -m rules check` verifies each rule on (against finite differences and JAX).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from .._helpers import scalar_rule as _scalar_rule
from .._primitive import primitive
from .._projection import ProjectTo
from .._registry import frule, register_examples, rrule
from .._thunks import unthunk
from .._zeros import NoTangent, ZeroTangent

# Keyed on the JAX functions themselves (see above): registered on plain functions knowingly.
scalar_rule = functools.partial(_scalar_rule, plain=True)

_LOG2, _LOG10, _SQRT_PI = math.log(2.0), math.log(10.0), math.sqrt(math.pi)

# Example inputs: inside every domain below, away from branch points.
_X = np.array([0.3, 0.55, 0.8])
_X32 = _X.astype(np.float32)
_POS = np.array([0.4, 1.3, 2.5])
_BIG = np.array([1.2, 1.7, 3.0])
_Z = np.array([0.3 + 0.4j, -0.5 + 0.2j])


def _safe_div(a, b):
    """a / b, and 0 where b == 0 (the zero subgradient at a kink)."""
    return jnp.where(b == 0, 0.0, a / jnp.where(b == 0, 1.0, b))


def _ex(*arrays):
    return [tuple(np.asarray(a) for a in arrays)]


# Tails where the textbook partial, written with the output, rounds to 0 or overflows.
_HUGE = np.array([1e200, 3e160, 2.0])  # squares overflow
_LEFT = np.array([40.0, 25.0, 3.0])  # expm1(-40) + 1 == 0 in float64
_TAIL32 = np.array([17.0, -9.01, 0.5], np.float32)  # 1 - y**2 and y * (1 - y) round to 0 in float32
_E8 = np.array([1e8, -3.0, 0.5], np.float32)  # logaddexp(1e8, 1e8 + 1) == 1e8 + 1 in float32
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _arctan2_partials(a, b):
    """(b, -a) / (a**2 + b**2), scaled by m = max(|a|, |b|): a**2 + b**2 underflows at 1e-200
    (JAX: inf). Not (b / h) / h with h = hypot(a, b): XLA rewrites A / B / C as A / (B * C)."""
    m = jnp.maximum(jnp.abs(a), jnp.abs(b))
    m = jnp.where(m == 0, 1.0, m)  # at the origin 0 / 0: NaN, as the angle jumps there
    a_m, b_m = a * (1 / m), b * (1 / m)  # no quotient of a quotient, which XLA would reassociate
    r = (a_m * a_m + b_m * b_m) * m
    return b_m / r, -a_m / r


def _sinc_slope(x, y):
    """(cos(pi x) - sinc(x)) / x, by its series where that difference cancels (|x| small).

    The series' first omitted term and the formula's rounding error are both below ~1e-13
    (float64, |x| < 0.02) or ~1e-6 (float32, |x| < 0.2) relative at the switch.
    """
    small = 0.2 if jnp.finfo(jnp.result_type(x, float)).eps > 1e-10 else 0.02
    near = jnp.abs(x) < small
    t = jnp.where(near, 1.0, x)
    u = math.pi**2 * x * x
    series = -(math.pi**2) * x / 3 * (1 - u / 10 * (1 - u / 28 * (1 - u / 54)))
    return jnp.where(near, series, (jnp.cos(math.pi * t) - y) / t)


def _arcsinh_slope(x):
    """1 / sqrt(x**2 + 1); for real x by hypot, as x**2 overflows at 1e200 (JAX: 0)."""
    return 1 / jnp.sqrt(x * x + 1) if jnp.iscomplexobj(x) else 1 / jnp.hypot(x, 1.0)


def _logaddexp_weights(a, b, log_base):
    """(exp(a - y), exp(b - y)) as logistic functions of a - b.

    y rounds to max(a, b) in float32 at 1e8 (JAX's weights then sum to 2); equal arguments
    weigh 1/2 each, +inf included; two -inf (an empty sum) weigh 0, as the library's
    `logsumexp` of a fully masked row does.
    """
    # only an infinite tie needs its weights set (a - b is NaN there); a finite one gets
    # sigmoid(0) = 1/2 from a - b, so that the weights' derivative (1/4) is kept
    inf_tie, empty = (a == b) & jnp.isinf(a), (a == -jnp.inf) & (b == -jnp.inf)
    d = jnp.where(inf_tie, 0.0, a - b) * log_base
    w = jnp.where(inf_tie, 0.5, _sigmoid(d))
    w_b = jnp.where(inf_tie, 0.5, _sigmoid(-d))
    return jnp.where(empty, 0.0, w), jnp.where(empty, 0.0, w_b)


@jax.custom_jvp
def _power_of_x(x, q):
    """x**q, whose own derivatives in x are right at x = 0: the slope is q x**(q - 1) by this
    function again, and 0 for q == 0 (x**0 is 1 everywhere), where JAX's pow has 0 * 0**-1 =
    0 * inf = NaN. The partial p x**(p - 1) is then differentiated to any order without it:
    the second derivative of x**1 at 0, the third of x**2, the Hessian of `vander`."""
    return jnp.power(x, q)


def _power_of_x_jvp(primals, tangents):
    # symbolic zeros: an unperturbed argument adds nothing (not 0 * inf = NaN where x = 0)
    x, q = primals
    x_dot, q_dot = tangents
    y = _power_of_x(x, q)
    y_dot = jnp.zeros_like(y)
    if not isinstance(x_dot, SymbolicZero):
        flat = (q == 0) & (x == 0)  # only there: elsewhere q x**(q - 1) at q == 0 keeps its d/dq 1/x
        slope = jnp.where(flat, 0, q * _power_of_x(x, jnp.where(flat, 1, q) - 1))  # holomorphic
        y_dot = y_dot + (slope * x_dot).astype(y.dtype)
    if not isinstance(q_dot, SymbolicZero):
        # x**q log x, with the real log|x| for a real power (ChainRules), and log 1 at x = 0
        # (as JAX's pow: 0 there, or NaN where x**q is infinite)
        x_safe = jnp.where(x == 0, 1, x)
        log_x = jnp.log(x_safe.astype(y.dtype)) if jnp.iscomplexobj(y) else jnp.log(jnp.abs(x_safe))
        y_dot = y_dot + (y * log_x * q_dot).astype(y.dtype)
    return y, y_dot


_power_of_x.defjvp(_power_of_x_jvp, symbolic_zeros=True)


def _power_partials(x, p):
    """d(x**p)/dx and d(x**p)/dp as ChainRules.jl has them at x = 0 (its POWERGRADS table).

    d/dx = p x**(p - 1), which is 0 for p == 0 (JAX: 0 * inf = NaN) and 1 for p == 1; d/dp =
    x**p log|x| (the real part of the complex log, as ChainRules), and at x = 0: 0 for p > 0,
    NaN otherwise (x**p is not continuous in p there). The powers are `_power_of_x`'s, so the
    partials' own derivatives are finite at x = 0 where the true ones are, and keep log|x|.
    """
    zero_p = (p == 0) & (x == 0)  # elsewhere p x**(p - 1) is 0 at p == 0, and its d/dp 1/x kept
    dx = jnp.where(zero_p, 0.0, p * _power_of_x(x, jnp.where(zero_p, 1, p) - 1))
    at_zero = x == 0
    if jnp.iscomplexobj(x) or jnp.iscomplexobj(p):
        return dx, jnp.where(at_zero, 0.0, _power_of_x(x, p) * jnp.log(jnp.where(at_zero, 1.0, x)))
    dp = _power_of_x(x, p) * jnp.log(jnp.where(at_zero, 1.0, jnp.abs(x)))
    return dx, jnp.where(at_zero, jnp.where(p > 0, 0.0, jnp.nan), dp)


def _elu_partials(x, alpha):
    """elu = x (x > 0), alpha expm1(x): d/dx = alpha exp(x), not y + 1 (0 at x = -40)."""
    left = jnp.minimum(x, 0.0)
    return jnp.where(x > 0, 1.0, alpha * jnp.exp(left)), jnp.where(x > 0, 0.0, jnp.expm1(left))


def _alpha_optional(partials, x, alpha_and_y):
    """The partials of f(x) or f(x, alpha): (x, y) means alpha = 1 (JAX's default), not moved."""
    return partials(x, alpha_and_y[0]) if len(alpha_and_y) == 2 else partials(x, 1.0)[0]


def _celu_partials(x, alpha):
    """celu = max(x, 0) + alpha expm1(min(x, 0) / alpha)."""
    t = jnp.minimum(x, 0.0) / alpha
    return jnp.where(x > 0, 1.0, jnp.exp(t)), jnp.where(x > 0, 0.0, jnp.expm1(t) - t * jnp.exp(t))


# ----- trigonometric ------------------------------------------------------------------------
scalar_rule(jnp.sin, lambda x, y: jnp.cos(x), examples=_ex(_X) + _ex(_X32) + _ex(_Z))
scalar_rule(jnp.cos, lambda x, y: -jnp.sin(x), examples=_ex(_X) + _ex(_Z))
scalar_rule(jnp.tan, lambda x, y: 1 + y * y, examples=_ex(_X) + _ex(_Z))
scalar_rule(jnp.arcsin, lambda x, y: 1 / jnp.sqrt(1 - x * x), examples=_ex(_X))
scalar_rule(jnp.arccos, lambda x, y: -1 / jnp.sqrt(1 - x * x), examples=_ex(_X))
scalar_rule(jnp.arctan, lambda x, y: 1 / (1 + x * x), examples=_ex(_X) + _ex(_Z))
scalar_rule(jnp.arctan2, lambda a, b, y: _arctan2_partials(a, b), examples=_ex(_X, _POS))
scalar_rule(jnp.hypot, lambda a, b, y: (_safe_div(a, y), _safe_div(b, y)), examples=_ex(_X, _POS))
scalar_rule(jnp.sinc, lambda x, y: _sinc_slope(x, y), examples=_ex(_X) + _ex(np.array([1e-8, -3e-3, 0.015])))
scalar_rule(jnp.deg2rad, lambda x, y: math.pi / 180, examples=_ex(_X))
scalar_rule(jnp.rad2deg, lambda x, y: 180 / math.pi, examples=_ex(_X))

# ----- hyperbolic ---------------------------------------------------------------------------
scalar_rule(jnp.sinh, lambda x, y: jnp.cosh(x), examples=_ex(_X) + _ex(_Z))
scalar_rule(jnp.cosh, lambda x, y: jnp.sinh(x), examples=_ex(_X) + _ex(_Z))
scalar_rule(jnp.tanh, lambda x, y: 1 / jnp.square(jnp.cosh(x)), examples=_ex(_X) + _ex(_X32) + _ex(_Z) + _ex(_TAIL32))
scalar_rule(jnp.arcsinh, lambda x, y: _arcsinh_slope(x), examples=_ex(_X) + _ex(_HUGE) + _ex(_Z))
scalar_rule(jnp.arccosh, lambda x, y: 1 / (jnp.sqrt(x - 1) * jnp.sqrt(x + 1)), examples=_ex(_BIG) + _ex(_HUGE) + _ex(_Z))
scalar_rule(jnp.arctanh, lambda x, y: 1 / (1 - x * x), examples=_ex(_X))

# ----- exponentials and logarithms ----------------------------------------------------------
scalar_rule(jnp.exp, lambda x, y: y, examples=_ex(_X) + _ex(_X32) + _ex(_Z))
scalar_rule(jnp.exp2, lambda x, y: y * _LOG2, examples=_ex(_X))
scalar_rule(jnp.expm1, lambda x, y: jnp.exp(x), examples=_ex(_X) + _ex(-_LEFT))
scalar_rule(jnp.log, lambda x, y: 1 / x, examples=_ex(_POS) + _ex(_Z))
scalar_rule(jnp.log1p, lambda x, y: 1 / (1 + x), examples=_ex(_X))
scalar_rule(jnp.log2, lambda x, y: 1 / (x * _LOG2), examples=_ex(_POS))
scalar_rule(jnp.log10, lambda x, y: 1 / (x * _LOG10), examples=_ex(_POS))
scalar_rule(jnp.logaddexp, lambda a, b, y: _logaddexp_weights(a, b, 1.0), examples=_ex(_X, _POS) + _ex(_E8, _E8 + 1))
scalar_rule(jnp.logaddexp2, lambda a, b, y: _logaddexp_weights(a, b, _LOG2), examples=_ex(_X, _POS))

# ----- powers and roots ---------------------------------------------------------------------
scalar_rule(jnp.sqrt, lambda x, y: 0.5 / y, examples=_ex(_POS) + _ex(_Z))
scalar_rule(jnp.cbrt, lambda x, y: 1 / (3 * y * y), examples=_ex(_POS))
scalar_rule(jnp.square, lambda x, y: 2 * x, examples=_ex(_X) + _ex(_Z))
scalar_rule(jnp.reciprocal, lambda x, y: -y * y, examples=_ex(_POS) + _ex(_Z))
scalar_rule(jnp.power, lambda x, p, y: _power_partials(x, p), examples=_ex(_POS, _X) + _ex(_Z, _Z[::-1]))

# ----- arithmetic ---------------------------------------------------------------------------
scalar_rule(jnp.negative, lambda x, y: -1.0, examples=_ex(_X))
scalar_rule(jnp.add, lambda a, b, y: (1.0, 1.0), examples=_ex(_X, _POS))
scalar_rule(jnp.subtract, lambda a, b, y: (1.0, -1.0), examples=_ex(_X, _POS))
scalar_rule(jnp.multiply, lambda a, b, y: (b, a), examples=_ex(_X, _POS) + _ex(_Z, _Z[::-1]))
scalar_rule(jnp.divide, lambda a, b, y: (1 / b, -y / b), examples=_ex(_X, _POS))

# ----- special functions --------------------------------------------------------------------
scalar_rule(jsp.erf, lambda x, y: (2 / _SQRT_PI) * jnp.exp(-x * x), examples=_ex(_X))
scalar_rule(jsp.erfc, lambda x, y: (-2 / _SQRT_PI) * jnp.exp(-x * x), examples=_ex(_X))
scalar_rule(jsp.erfinv, lambda x, y: (_SQRT_PI / 2) * jnp.exp(y * y), examples=_ex(_X))
scalar_rule(jsp.gammaln, lambda x, y: jsp.digamma(x), examples=_ex(_POS))
_sigmoid = primitive(jax.nn.sigmoid)  # by the rule below: for the slopes here and rules.library.nn's
scalar_rule(jsp.expit, lambda x, y: _sigmoid(x) * _sigmoid(-x), examples=_ex(_X) + _ex(_TAIL32))
scalar_rule(jsp.logit, lambda x, y: 1 / (x * (1 - x)), examples=_ex(_X))

# ----- jax.nn activations -------------------------------------------------------------------
# sigmoid's slope s(x) s(-x) is again sigmoid's rule (`_sigmoid`), to every order: JAX's own
# s (1 - s) is 0 once s(x) rounds to 1 (x > ~37 in float64, ~17 in float32), so the second
# and later derivatives of softplus, log_sigmoid and silu through it were 0 in the tails (true
# ~e^-|x|: 4.2e-18 at 40) and 1e-3 off at 30
scalar_rule(jax.nn.sigmoid, lambda x, y: _sigmoid(x) * _sigmoid(-x), examples=_ex(_X) + _ex(_TAIL32))
scalar_rule(jax.nn.softplus, lambda x, y: _sigmoid(x), examples=_ex(_X))
scalar_rule(jax.nn.log_sigmoid, lambda x, y: _sigmoid(-x), examples=_ex(_X))
scalar_rule(jax.nn.silu, lambda x, y: _sigmoid(x) * (1 + x * _sigmoid(-x)), examples=_ex(_X))
scalar_rule(jax.nn.elu, lambda x, *rest: _alpha_optional(_elu_partials, x, rest), examples=_ex(_X - 0.5, _POS) + _ex(-_LEFT, _POS))
scalar_rule(jax.nn.celu, lambda x, *rest: _alpha_optional(_celu_partials, x, rest), examples=_ex(_X - 0.5, _POS) + _ex(-_LEFT, _POS))
scalar_rule(jax.nn.selu, lambda x, y: _SELU_SCALE * _elu_partials(x, _SELU_ALPHA)[0], examples=_ex(_X - 0.5) + _ex(-_LEFT))


# ----- abs: 0 at 0, and the complex case ----------------------------------------------------
# abs is not holomorphic, so it is written out: for complex z, x_bar = real(y_bar) * z / |z|,
# and at 0 the zero subgradient replaces JAX's NaN (complex) / sign convention.
def _unit(x):
    y = jnp.abs(x)
    safe = jnp.where(y == 0, 1, y)
    return jnp.where(y == 0, 0, x / safe).astype(jnp.result_type(x))


@frule.register(jnp.abs, plain=True)
def abs_frule(tangents, x):
    _, x_dot = tangents
    y = jnp.abs(x)
    if isinstance(x_dot, (NoTangent, ZeroTangent)):
        return y, ZeroTangent()
    return y, jnp.real(jnp.conj(_unit(x)) * x_dot).astype(y.dtype)


@rrule.register(jnp.abs, plain=True)
def abs_rrule(x):
    project_x = ProjectTo(x)
    unit = _unit(x)

    def abs_pullback(y_bar):
        return NoTangent(), project_x(jnp.real(unthunk(y_bar)) * unit)

    return jnp.abs(x), abs_pullback


register_examples(jnp.abs, _ex(_X - 0.5) + _ex(_Z))


# ----- sign: derivative zero for real x; for complex z, sign(z) = z / |z| turns with z ------
# d sign(z) = i Im(conj(s) dz) s / |z| (s = sign(z)), real-linear, not holomorphic; ChainRules'
# cotangent is then z_bar = i Im(y_bar conj(s)) s / |z|, and 0 at z = 0 (as abs).
def _sign_turn(x):
    r = jnp.abs(x)
    s = x / jnp.where(r == 0, 1, r)  # 0 at 0, and so is s / |z| there; not jnp.sign, whose
    return s, s / jnp.where(r == 0, 1, r)  # own derivative is 0 on jax < 0.11 (wrong Hessians)


@frule.register(jnp.sign, plain=True)
def sign_frule(tangents, x):
    _, x_dot = tangents
    x_dot = unthunk(x_dot)
    if not jnp.iscomplexobj(x) or isinstance(x_dot, (NoTangent, ZeroTangent)):
        return jnp.sign(x), ZeroTangent()
    s, turn = _sign_turn(x)
    return s, 1j * jnp.imag(jnp.conj(s) * x_dot) * turn


@rrule.register(jnp.sign, plain=True)
def sign_rrule(x):
    project_x = ProjectTo(x)

    def sign_pullback(y_bar):
        if not jnp.iscomplexobj(x) or isinstance(y_bar, (NoTangent, ZeroTangent)):
            return NoTangent(), ZeroTangent()
        s, turn = _sign_turn(x)
        return NoTangent(), project_x(1j * jnp.imag(unthunk(y_bar) * jnp.conj(s)) * turn)

    return jnp.sign(x), sign_pullback


register_examples(jnp.sign, _ex(_X - 0.5) + _ex(np.array([-1.1 - 0.21j, 0.3 + 0.4j])))
