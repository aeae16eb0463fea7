"""Special functions from SciPy, differentiable in JAX: Bessel, Struve, gamma, zeta, erfcx.

Each function is a `primitive` whose primal runs `scipy.special` on the host through
`rules.external` (`jax.pure_callback`), in float64, cast back to the arguments' dtype. JAX
cannot differentiate a callback, so each has an frule with the derivative in closed form;
there is deliberately no rrule: a primitive with only an frule is lowered through
`jax.custom_jvp`, which JAX transposes for reverse mode, so `jax.jvp`, `jax.grad`,
`jax.hessian` and grad-of-grad all work. Where the derivative needs the function itself
(Bessel recurrences, `zeta(s + 1, q)`, erfcx's slope), the frule calls a primitive again, so
derivatives of any order are again rules of primitives.

Orders and shape parameters (`v`, `a`, `s`) are not differentiated: the frule returns a
`NotImplementedTangent` for them (differentiating raises `NotImplementedTangentError`), as
ChainRules.jl does for `besselk(nu, x)`. They may be Python numbers or arrays that broadcast
with `x`.

vmap: arguments are broadcast to one shape and dtype in JAX before the callback, and every
host function is an elementwise SciPy ufunc, so all externals use `vmap_method="expand_dims"`:
one host call per batch, unbatched operands passed with a size-1 batch axis that NumPy
broadcasting stretches. "broadcast_all" would copy unbatched operands once per batch element
for nothing, and "sequential" would make one host call per batch element.

In JAX 0.10.2, `jax.scipy.special` has none of kv, kve, iv, ive, jv, yv (only integer-order
i0/i1/i0e/i1e and `bessel_jn`) nor struve; JAX 0.12.1 adds `iv`, `jn`, `kn` and `yn` of a
static integer order only (a float or traced order raises). It has gammaincc, expi, zeta,
erfcx and spence, with which these agree (and improve on at the edges: see each docstring).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np

from .._errors import format_message
from .._notimplemented import not_implemented
from .._primitive import external, primitive
from .._zeros import AbstractZero, ZeroTangent
from ._kernels import gamma_kernel

__all__ = ["kv", "kve", "iv", "ive", "jv", "yv", "struve", "gammaincc", "expi", "zeta", "erfcx", "spence"]

_SQRT_PI = math.sqrt(math.pi)

# Example inputs. Orders are integer arrays or ints in the examples (non-differentiable to the
# core, so `python -m rules check` does not perturb them); non-integer orders are checked in
# tests/rules/library/test_special.py.
_V = np.array([0, 1, 3])
_X = np.array([0.7, 1.9, 3.1])
_X32 = _X.astype(np.float32)


# ----- host calls -----------------------------------------------------------------------------
def _like_first(*args: Any) -> jax.ShapeDtypeStruct:
    """The result spec of an elementwise host call on arguments of one shape and dtype."""
    return jax.ShapeDtypeStruct(jnp.shape(args[0]), jnp.result_type(args[0]))


def _host(name: str) -> Callable:
    def host(*args):
        import scipy.special  # imported on first use: `import rules` does not pay for SciPy

        return getattr(scipy.special, name)(*(np.asarray(a, np.float64) for a in args))

    host.__name__ = host.__qualname__ = name
    return host


def _float_dtype(name: str, *args: Any) -> Any:
    """The promoted real floating dtype of the arguments (float32 stays float32; ints -> float)."""
    dtype = jnp.result_type(float, *args)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        raise TypeError(
            format_message(
                f"`rules.library.special.{name}`: complex arguments are not supported",
                expected="real floating or integer arguments",
                got=f"dtype {dtype}",
                fix=f"call `scipy.special.{name}` outside JAX for complex arguments",
            )
        )
    return dtype


def _prepare(name: str, *args: Any) -> list:
    """The arguments as arrays of one real floating dtype and one (broadcast) shape.

    Equal ranks are what makes `vmap_method="expand_dims"` correct: the host sees every
    operand with the batch axis in front of the same dimensions.
    """
    dtype = _float_dtype(name, *args)
    return list(jnp.broadcast_arrays(*(jnp.asarray(a, dtype) for a in args)))  # a tuple since jax 0.11


class _Host:
    """A SciPy function run on the host: through `rules.external` under a JAX trace, directly
    with NumPy otherwise (an eager `pure_callback` would be compiled anew on every call)."""

    def __init__(self, name: str, host: Callable, label: str | None = None):
        self.name, self.host = name, host
        label = label or f"scipy.special.{name}"
        self.external = external(host, _like_first, vmap_method="expand_dims", name=label)

    def __call__(self, *args: Any) -> jax.Array:
        if any(isinstance(a, jax.core.Tracer) for a in args):
            return self.external(*_prepare(self.name, *args))
        dtype = _float_dtype(self.name, *args)
        return jnp.asarray(np.asarray(self.host(*args)).astype(dtype, copy=False))


def _scipy(name: str) -> _Host:
    return _Host(name, _host(name))


_KV, _KVE, _IV, _IVE = _scipy("kv"), _scipy("kve"), _scipy("iv"), _scipy("ive")
_JV, _YV, _STRUVE = _scipy("jv"), _scipy("yv"), _scipy("struve")
_GAMMAINCC, _EXPI, _ZETA = _scipy("gammaincc"), _scipy("expi"), _scipy("zeta")
_ERFCX, _SPENCE = _scipy("erfcx"), _scipy("spence")


# ----- frule helpers --------------------------------------------------------------------------
def _tangent(name: str, what: str, p_dot: Any, x_dot: Any, shape: tuple, slope: Callable[[], Any]) -> Any:
    """`slope() * x_dot` for `f(p, x)`, and a NotImplementedTangent if the parameter `p` moves."""
    y_dot: Any = ZeroTangent()
    if not isinstance(x_dot, AbstractZero):
        y_dot = slope() * jnp.broadcast_to(x_dot, shape)
    if not isinstance(p_dot, AbstractZero):
        y_dot = not_implemented(f"`{name}`: the derivative with respect to {what} is not implemented") + y_dot
    return y_dot


# ----- derivatives of ive and kve ---------------------------------------------------------------
# d/dx ive_v = (ive_{v-1} + ive_{v+1}) / 2 - sign(x) ive_v, and kve_v' = kve_v - (kve_{v-1} +
# kve_{v+1}) / 2: differences of nearly equal terms at large x (each ~ x^-1/2, the slope ~
# x^-3/2), so the n-th derivative by these recurrences loses ~x^n ulps: in float32 1.6e-3 of the
# slope at x = 1e4, in float64 3e-4 of the second derivative at 1e6. Here the n-th derivative
# is one host call in float64: the recurrence applied n times (orders v - n .. v + n) where x
# is small, and from x >= max(25, v^2 / 2) on the asymptotic series of ive (kve),
# (2 pi x)^-1/2 sum_k (-1)^k a_k(v) x^-k (sqrt(pi / (2x)) sum_k a_k(v) x^-k), differentiated
# term by term, a_k(v) = prod_{j<=k} (4v^2 - (2j - 1)^2) / (k! 8^k), summed up to its smallest
# term (at most 60; at x = 25 the smallest is below 1e-20 of the sum). Against mpmath: float64
# within 1e-11 to the third derivative, float32 an ulp.
_ASYMPTOTIC_TERMS = 60


def _recurrence(kind: str, n: int, v, x):
    """The n-th derivative by the recurrence, D^n = (A - sign(x))^n for ive and (1 - A)^n for
    kve with A = (S- + S+) / 2, S+- the shifts of the order: sum_m c_m f(v + m, x)."""
    import scipy.special

    f = scipy.special.ive if kind == "ive" else scipy.special.kve
    total = np.zeros_like(x)
    for i in range(n + 1):  # C(n, i) A^i (-sign(x))^(n - i), or C(n, i) (-A)^i
        other = (-np.sign(x)) ** (n - i) if kind == "ive" else (-1.0) ** i
        for j in range(i + 1):  # A^i = 2^-i sum_j C(i, j) S^(2j - i)
            total = total + math.comb(n, i) * math.comb(i, j) / 2**i * other * f(v + 2 * j - i, x)
    return total


def _sum_to_smallest_term(terms, free):
    """The sum of an asymptotic series' terms (arrays, k = 0, 1, ...) up to its smallest one:
    past k = `free` a term larger than the last means the series has begun to diverge, and it
    and the rest are left out (before `free` the terms may still grow)."""
    total = last = going = None
    for k, term in enumerate(terms):
        if total is None:
            total, last, going = np.zeros_like(term), np.full_like(term, np.inf), np.ones(term.shape, bool)
        going = going & ((k <= free) | (np.abs(term) <= last))
        total, last = total + np.where(going, term, 0.0), np.where(going, np.abs(term), last)
    return total


def _derivative_of_power(power: float, n: int, x):
    """d^n/dx^n x^power = power (power - 1) ... (power - n + 1) x^(power - n)."""
    return math.prod(power - i for i in range(n)) * x ** (power - n)


def _asymptotic(kind: str, n: int, v, x):
    """The n-th derivative of the asymptotic series, for x >= max(25, v^2 / 2), summed up to its
    smallest term past k = v + 2n (before it, the factors 4v^2 - (2k-1)^2 and those of the
    derivative may make a term larger than the last)."""
    def terms():
        a = np.ones_like(x)  # a_k(v)
        for k in range(_ASYMPTOTIC_TERMS):
            if k:
                a = a * (4 * v * v - (2 * k - 1) ** 2) / (8 * k)
            yield (-1.0 if kind == "ive" else 1.0) ** k * a * _derivative_of_power(-k - 0.5, n, x)

    return _sum_to_smallest_term(terms(), v + 2 * n) * ((2 * math.pi) ** -0.5 if kind == "ive" else math.sqrt(math.pi / 2))


def _scaled_bessel_derivative_host(kind: str) -> Callable:
    def host(n, v, x):
        n_, v, x = (np.asarray(a, np.float64) for a in (n, v, x))
        order = int(n_.flat[0]) if n_.size else 1
        # ive(v, -x) = (-1)^v ive(v, x): negative x (integer orders) from |x|; NaN otherwise, as SciPy
        mirror = (kind == "ive") & (x < 0)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            sign = np.where(mirror, np.power(-1.0, v + order), 1.0)
            x = np.where(mirror, -x, x)
            far = x >= np.maximum(25.0, v * v / 2)
            return sign * np.where(far, _asymptotic(kind, order, v, np.where(far, x, 25.0)), _recurrence(kind, order, v, x))

    host.__name__ = host.__qualname__ = f"{kind}_derivative"
    return host


_IVE_DERIVATIVE = _Host("ive", _scaled_bessel_derivative_host("ive"), label="ive_derivative")
_KVE_DERIVATIVE = _Host("kve", _scaled_bessel_derivative_host("kve"), label="kve_derivative")


@primitive(examples=[(1, _V, _X - 1.5), (2, _V, np.array([0.5, 45.0, 300.0]))])
def _ive_derivative(n, v, x):
    """The n-th derivative of `ive` in x, in float64 on the host (above); its frule is the
    (n+1)-th, so every order of derivative is a rule."""
    return _IVE_DERIVATIVE(n, v, x)


@primitive(examples=[(1, _V, _X), (2, _V, np.array([0.5, 45.0, 300.0]))])
def _kve_derivative(n, v, x):
    """The n-th derivative of `kve` in x, in float64 on the host (above); its frule is the
    (n+1)-th."""
    return _KVE_DERIVATIVE(n, v, x)


def _scaled_derivative_frule(name: str, derivative: Callable) -> Callable:
    def frule(tangents, n, v, x):
        _, _, v_dot, x_dot = tangents
        y = derivative(n, v, x)
        return y, _tangent(name, "the order v", v_dot, x_dot, y.shape, lambda: derivative(n + 1, v, x))

    return frule


_ive_derivative.frule(_scaled_derivative_frule("ive", _ive_derivative))
_kve_derivative.frule(_scaled_derivative_frule("kve", _kve_derivative))


# ----- kv ---------------------------------------------------------------------------------------
@primitive(examples=[(_V, _X), (np.array([[1], [2]]), np.array([[0.4, 1.1, 2.6]])), (2, _X32)])
def kv(v, x):
    """Modified Bessel function of the second kind K_v(x), of real order `v`.

    Why: JAX has no K_v at all; here the primal runs SciPy and the frule gives
    dK_v/dx = -(K_{v-1} + K_{v+1}) / 2, again through `kv`.

    Args:
      v: the order (real; broadcasts with `x`; not differentiated).
      x: the argument, x > 0.

    Returns:
      K_v(x), with the broadcast shape and the promoted floating dtype of `v` and `x`.

    >>> import jax
    >>> from rules.library.special import kv
    >>> round(float(kv(1.5, 2.0)), 6), round(float(jax.grad(kv, argnums=1)(1.5, 2.0)), 6)
    (0.179907, -0.254868)

    See also: `kve`, `iv`, `scipy.special.kv`.
    """
    return _KV(v, x)


@kv.frule
def kv_frule(tangents, v, x):
    _, v_dot, x_dot = tangents
    y = kv(v, x)
    return y, _tangent("kv", "the order v", v_dot, x_dot, y.shape, lambda: -(kv(v - 1, x) + kv(v + 1, x)) / 2)


# ----- kve --------------------------------------------------------------------------------------
@primitive(examples=[(_V, _X)])
def kve(v, x):
    """Exponentially scaled modified Bessel function of the second kind, K_v(x) e^x.

    Why: JAX has no kve; it stays finite where K_v underflows (large x, e.g. Matern kernels),
    and its frule d/dx = kve_v - (kve_{v-1} + kve_{v+1}) / 2 stays finite with it: each
    derivative is one float64 host call (`_kve_derivative`), by the asymptotic series where
    x is large and that difference would cancel.

    Args:
      v: the order (real; broadcasts with `x`; not differentiated).
      x: the argument, x > 0.

    Returns:
      K_v(x) exp(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.special import kv, kve
    >>> float(kv(0.5, 800.0)), round(float(kve(0.5, 800.0)), 6)
    (0.0, 0.044311)
    >>> round(float(jax.grad(kve, argnums=1)(0.5, 2.0)), 6)
    -0.221557

    See also: `kv`, `scipy.special.kve`.
    """
    return _KVE(v, x)


@kve.frule
def kve_frule(tangents, v, x):
    _, v_dot, x_dot = tangents
    y = kve(v, x)
    return y, _tangent("kve", "the order v", v_dot, x_dot, y.shape, lambda: _kve_derivative(1, v, x))


# ----- iv ---------------------------------------------------------------------------------------
@primitive(examples=[(_V, _X), (1, _X32)])
def iv(v, x):
    """Modified Bessel function of the first kind I_v(x), of real order `v`.

    Why: JAX has only i0/i1 (integer orders 0 and 1); the frule gives
    dI_v/dx = (I_{v-1} + I_{v+1}) / 2, again through `iv`.

    Args:
      v: the order (real; broadcasts with `x`; not differentiated).
      x: the argument (x < 0 only for integer v).

    Returns:
      I_v(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.special import iv
    >>> round(float(iv(2.5, 1.0)), 6), round(float(jax.grad(iv, argnums=1)(2.5, 1.0)), 6)
    (0.057099, 0.150778)

    See also: `ive`, `kv`, `scipy.special.iv`.
    """
    return _IV(v, x)


@iv.frule
def iv_frule(tangents, v, x):
    _, v_dot, x_dot = tangents
    y = iv(v, x)
    return y, _tangent("iv", "the order v", v_dot, x_dot, y.shape, lambda: (iv(v - 1, x) + iv(v + 1, x)) / 2)


# ----- ive --------------------------------------------------------------------------------------
@primitive(examples=[(_V, _X - 1.5)])
def ive(v, x):
    """Exponentially scaled modified Bessel function of the first kind, I_v(x) e^{-|x|}.

    Why: JAX has no ive of real order; it stays finite where I_v overflows (von Mises-Fisher
    normalisers), and its frule d/dx = (ive_{v-1} + ive_{v+1}) / 2 - sign(x) ive_v stays
    finite with it: each derivative is one float64 host call (`_ive_derivative`), by the
    asymptotic series where x is large and that difference would cancel.

    Args:
      v: the order (real; broadcasts with `x`; not differentiated).
      x: the argument (x < 0 only for integer v).

    Returns:
      I_v(x) exp(-|x|), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.special import ive
    >>> round(float(ive(3.5, 1000.0)), 6), round(float(jax.grad(ive, argnums=1)(3.5, 1000.0)), 8)
    (0.01254, -6.19e-06)

    See also: `iv`, `scipy.special.ive`.
    """
    return _IVE(v, x)


@ive.frule
def ive_frule(tangents, v, x):
    _, v_dot, x_dot = tangents
    y = ive(v, x)
    return y, _tangent("ive", "the order v", v_dot, x_dot, y.shape, lambda: _ive_derivative(1, v, x))


# ----- jv ---------------------------------------------------------------------------------------
@primitive(examples=[(_V, _X), (0, _X32)])
def jv(v, x):
    """Bessel function of the first kind J_v(x), of real order `v`.

    Why: JAX has integer orders only (`bessel_jn`; `jn` from 0.12.1); the frule gives
    dJ_v/dx = (J_{v-1} - J_{v+1}) / 2, again through `jv`.

    Args:
      v: the order (real; broadcasts with `x`; not differentiated).
      x: the argument (x < 0 only for integer v).

    Returns:
      J_v(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.special import jv
    >>> round(float(jv(0.5, 2.0)), 6), round(float(jax.grad(jv, argnums=1)(0.5, 2.0)), 6)
    (0.513016, -0.36304)

    See also: `yv`, `iv`, `scipy.special.jv`.
    """
    return _JV(v, x)


@jv.frule
def jv_frule(tangents, v, x):
    _, v_dot, x_dot = tangents
    y = jv(v, x)
    return y, _tangent("jv", "the order v", v_dot, x_dot, y.shape, lambda: (jv(v - 1, x) - jv(v + 1, x)) / 2)


# ----- yv ---------------------------------------------------------------------------------------
@primitive(examples=[(_V, _X)])
def yv(v, x):
    """Bessel function of the second kind Y_v(x), of real order `v`.

    Why: JAX has no Y_v at all; the frule gives dY_v/dx = (Y_{v-1} - Y_{v+1}) / 2, again
    through `yv`.

    Args:
      v: the order (real; broadcasts with `x`; not differentiated).
      x: the argument, x > 0.

    Returns:
      Y_v(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.special import yv
    >>> round(float(yv(1.0, 2.0)), 6), round(float(jax.grad(yv, argnums=1)(1.0, 2.0)), 6)
    (-0.107032, 0.563891)

    See also: `jv`, `kv`, `scipy.special.yv`.
    """
    return _YV(v, x)


@yv.frule
def yv_frule(tangents, v, x):
    _, v_dot, x_dot = tangents
    y = yv(v, x)
    return y, _tangent("yv", "the order v", v_dot, x_dot, y.shape, lambda: (yv(v - 1, x) - yv(v + 1, x)) / 2)


# ----- struve -----------------------------------------------------------------------------------
@primitive(examples=[(_V, _X)])
def struve(v, x):
    """Struve function H_v(x), of real order `v`.

    Why: JAX has no Struve function; the frule gives (DLMF 11.4.24)
    dH_v/dx = (H_{v-1} - H_{v+1}) / 2 + (x/2)^v / (2 sqrt(pi) Gamma(v + 3/2)).

    Args:
      v: the order (real, v > -3/2; broadcasts with `x`; not differentiated).
      x: the argument (x < 0 only for integer v).

    Returns:
      H_v(x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.special import struve
    >>> round(float(struve(0.0, 1.0)), 6), round(float(jax.grad(struve, argnums=1)(0.0, 1.0)), 6)
    (0.568657, 0.438162)

    See also: `jv`, `yv`, `scipy.special.struve`.
    """
    return _STRUVE(v, x)


@jax.jit
def _struve_extra(v, x):
    """(x/2)^v / (2 sqrt(pi) Gamma(v + 3/2)): what H_v' adds to (H_{v-1} - H_{v+1}) / 2."""
    return jnp.power(x / 2, v) / (2 * _SQRT_PI * jsp.gamma(v + 1.5))


@struve.frule
def struve_frule(tangents, v, x):
    _, v_dot, x_dot = tangents
    y = struve(v, x)

    def slope():
        # at v = 0, H_0' = 2/pi - H_1: through H_{-1}, whose own slope needs H_{-2}(0) = inf, the
        # second derivative at x = 0 was NaN (true 0); x is held at 1 in the unused branch
        v_, x_ = _prepare("struve", v, x)
        zero = v_ == 0
        held = jnp.where(zero, jnp.ones_like(x_), x_)
        general = (struve(v_ - 1, held) - struve(v_ + 1, held)) / 2 + _struve_extra(v_, held)
        return jnp.where(zero, 2 / math.pi - struve(jnp.ones_like(v_), x_), general)

    return y, _tangent("struve", "the order v", v_dot, x_dot, y.shape, slope)


# ----- gammaincc --------------------------------------------------------------------------------
@primitive(examples=[(np.array([1, 2, 5]), _X), (np.array([1, 3, 6]), _X32)])
def gammaincc(a, x):
    """Regularised upper incomplete gamma function Q(a, x) = Gamma(a, x) / Gamma(a).

    Why: agrees with `jax.scipy.special.gammaincc`, but its derivative in x,
    -x^{a-1} e^{-x} / Gamma(a), is evaluated in log space with x^0 = 1, so it is -1 at
    (a=1, x=0), where JAX's gradient is NaN. `a` is not differentiated.

    Args:
      a: the shape, a > 0 (broadcasts with `x`; not differentiated).
      x: the argument, x >= 0.

    Returns:
      Q(a, x), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.special import gammaincc
    >>> round(float(gammaincc(2.5, 1.5)), 6), float(jax.grad(gammaincc, argnums=1)(1.0, 0.0))
    (0.699986, -1.0)

    See also: `jax.scipy.special.gammaincc`, `scipy.special.gammaincc`.
    """
    return _GAMMAINCC(a, x)


@gammaincc.frule
def gammaincc_frule(tangents, a, x):
    _, a_dot, x_dot = tangents
    y = gammaincc(a, x)
    slope = lambda: _gammaincc_slope(*_prepare("gammaincc", a, x))  # noqa: E731 - evaluated only if x moves
    return y, _tangent("gammaincc", "the shape a", a_dot, x_dot, y.shape, slope)


@jax.jit
def _gammaincc_slope(a, x):
    """dQ/dx = -x^(a-1) e^(-x) / Gamma(a), in log space (`gamma_kernel`: x^0 = 1 at x = 0,
    and its own derivatives right there: the second derivative of Q(2, x) at 0 is -1)."""
    return -gamma_kernel(a - 1, x, jsp.gammaln(a))


# ----- expi -------------------------------------------------------------------------------------
@primitive(examples=[(np.array([-2.0, -0.3, 0.4, 5.0]),), (np.array([-1.0, 0.5, 3.0], np.float32),)])
def expi(x):
    """Exponential integral Ei(x).

    Why: SciPy's Ei as an external (agrees with `jax.scipy.special.expi`), with the frule
    dEi/dx = e^x / x.

    Args:
      x: the argument (x != 0).

    Returns:
      Ei(x), same shape, floating dtype of `x`.

    >>> import jax
    >>> from rules.library.special import expi
    >>> round(float(expi(1.0)), 6), round(float(jax.grad(expi)(1.0)), 6)
    (1.895118, 2.718282)

    See also: `jax.scipy.special.expi`, `scipy.special.expi`.
    """
    return _EXPI(x)


@expi.frule
def expi_frule(tangents, x):
    _, x_dot = tangents
    y = expi(x)
    return y, _tangent("expi", "-", ZeroTangent(), x_dot, y.shape, lambda: _expi_slope(*_prepare("expi", x)))


@jax.jit
def _expi_slope(x):
    """e^x / x as e^(x/2) (e^(x/2) / x): e^x alone overflows first (float32 past 88.7, where
    Ei and its slope are finite up to ~93)."""
    half = jnp.exp(x / 2)
    return half * (half / x)


# ----- zeta -------------------------------------------------------------------------------------
@primitive(examples=[(np.array([2, 3, 5]), _X)])
def zeta(s, q=1.0):
    """Hurwitz zeta function zeta(s, q) = sum_{n>=0} (n + q)^{-s}; Riemann's for q = 1.

    Why: SciPy's zeta as an external (agrees with `jax.scipy.special.zeta`), with the frule
    d zeta/dq = -s zeta(s + 1, q), again through `zeta`. `s` is not differentiated.

    Args:
      s: the exponent, s > 1 (broadcasts with `q`; not differentiated).
      q: the shift, q > 0 (default 1).

    Returns:
      zeta(s, q), broadcast shape, promoted floating dtype.

    >>> import jax
    >>> from rules.library.special import zeta
    >>> round(float(zeta(2.0)), 6), round(float(jax.grad(zeta, argnums=1)(2.0, 1.0)), 6)
    (1.644934, -2.404114)

    See also: `jax.scipy.special.zeta`, `scipy.special.zeta`.
    """
    return _ZETA(s, q)


@zeta.frule
def zeta_frule(tangents, s, q=1.0):
    s_dot = tangents[1]
    q_dot = tangents[2] if len(tangents) > 2 else ZeroTangent()
    y = zeta(s, q)
    return y, _tangent("zeta", "the exponent s", s_dot, q_dot, y.shape, lambda: -s * zeta(s + 1, q))


# ----- erfcx ------------------------------------------------------------------------------------
@primitive(examples=[(np.array([-1.5, 0.3, 2.0, 25.0]),), (np.array([-0.5, 1.0, 40.0], np.float32),)])
def erfcx(x):
    """Scaled complementary error function erfcx(x) = e^{x^2} erfc(x).

    Why: agrees with `jax.scipy.special.erfcx`, but its derivative 2x erfcx(x) - 2/sqrt(pi)
    cancels catastrophically for large x (JAX's float32 gradient is 6% off at x = 1e3 and
    20 times too large at x = 1e4); here it is computed on the host in float64, from an
    asymptotic series for x >= 10: correctly rounded in float32, within 5e-14 in float64.

    Args:
      x: the argument.

    Returns:
      erfcx(x), same shape, floating dtype of `x`.

    >>> import jax
    >>> from rules.library.special import erfcx
    >>> round(float(erfcx(1.0)), 6), round(float(jax.grad(erfcx)(1.0)), 6)
    (0.427584, -0.273212)

    See also: `jax.scipy.special.erfcx`, `scipy.special.erfcx`.
    """
    return _ERFCX(x)


@erfcx.frule
def erfcx_frule(tangents, x):
    _, x_dot = tangents
    y = erfcx(x)
    return y, _tangent("erfcx", "-", ZeroTangent(), x_dot, y.shape, lambda: _erfcx_derivative(1, x))


# The n-th derivative of erfcx: by the recurrence erfcx' = 2x erfcx - 2/sqrt(pi), erfcx^(k) =
# 2x erfcx^(k-1) + 2(k-1) erfcx^(k-2), below x = 10 (where it cancels ~x^(2n)-fold: within
# 5e-14 for the slope, measured against mpmath on [-5, 30]); from x = 10 on, the asymptotic
# series erfcx(x) ~ sum_k (-1)^k (2k-1)!! / 2^k x^-(2k+1) / sqrt(pi) differentiated term by term,
# summed up to its smallest term (below 1e-17 relative there). Each derivative of erfcx is
# then right to every order: 2 erfcx + 2x erfcx' for the second cancelled 1e-4 at x = 1e6.
_ERFCX_SERIES_FROM = 10.0
_ERFCX_TERMS = 40


def _erfcx_asymptotic(n: int, x):
    def terms():
        coef = 1.0  # (-1)^k (2k-1)!! / 2^k
        for k in range(_ERFCX_TERMS):
            if k:
                coef = -coef * (2 * k - 1) / 2
            yield coef * _derivative_of_power(-(2 * k + 1), n, x)

    return _sum_to_smallest_term(terms(), n) / _SQRT_PI


def _erfcx_derivative_host(n, x):
    import scipy.special

    n_, x = np.asarray(n, np.float64), np.asarray(x, np.float64)
    order = int(n_.flat[0]) if n_.size else 1
    before, current = scipy.special.erfcx(x), 2 * x * scipy.special.erfcx(x) - 2 / _SQRT_PI
    for k in range(2, order + 1):
        before, current = current, 2 * x * current + 2 * (k - 1) * before
    far = x >= _ERFCX_SERIES_FROM
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(far, _erfcx_asymptotic(order, np.where(far, x, _ERFCX_SERIES_FROM)), current)


_ERFCX_DERIVATIVE = _Host("erfcx", _erfcx_derivative_host, label="erfcx_derivative")


@primitive(examples=[(1, np.array([-1.0, 0.5, 3.0, 12.0, 30.0])), (2, np.array([-1.0, 3.0, 12.0, 1e3]))])
def _erfcx_derivative(n, x):
    """The n-th derivative of `erfcx` (n >= 1), accurate for large x (an external).

    Why: a primitive of its own, whose frule is the (n+1)-th derivative, so that second and
    higher derivatives of `erfcx` are rules too, and none cancels.

    >>> round(float(_erfcx_derivative(1, 1.0)), 6)
    -0.273212

    See also: `erfcx`.
    """
    return _ERFCX_DERIVATIVE(n, x)


@_erfcx_derivative.frule
def _erfcx_derivative_frule(tangents, n, x):
    _, _, x_dot = tangents
    y = _erfcx_derivative(n, x)
    return y, _tangent("erfcx", "-", ZeroTangent(), x_dot, y.shape, lambda: _erfcx_derivative(n + 1, x))


# ----- spence -----------------------------------------------------------------------------------
@primitive(examples=[(np.array([0.3, 0.9995, 1.0, 2.5]),), (np.array([0.5, 1.0, 3.0], np.float32),)])
def spence(x):
    """Spence's function (dilogarithm) in SciPy's convention: int_1^x log(t) / (1 - t) dt.

    Why: agrees with `jax.scipy.special.spence`, but its derivative log(x) / (1 - x) is
    evaluated as -log1p(u)/u with u = x - 1 and a series near u = 0 (as written below x = 1/2,
    where x - 1 would lose x), so it is -1 at x = 1 and smooth through it, where JAX's gradient
    is 0 at x = 1 and NaN on (1, 2].

    Args:
      x: the argument, x >= 0.

    Returns:
      spence(x), same shape, floating dtype of `x`.

    >>> import jax
    >>> from rules.library.special import spence
    >>> round(float(spence(2.0)), 6), float(jax.grad(spence)(1.0))
    (-0.822467, -1.0)

    See also: `jax.scipy.special.spence`, `scipy.special.spence`.
    """
    return _SPENCE(x)


@jax.jit
def _spence_slope(x):
    """log(x) / (1 - x): as written for x < 1/2, where x - 1 would round x away (at 1e-20 it
    is -1, and log1p(-1) = -inf); -log1p(u) / u with u = x - 1 above, with a Taylor series
    for |u| < 1e-3. Each branch is evaluated at a harmless point where it is not used."""
    u = x - 1
    low, near = x < 0.5, jnp.abs(u) < 1e-3
    x_low = jnp.where(low, x, 0.25).astype(x.dtype)
    u_mid = jnp.where(low | near, 1.0, u).astype(u.dtype)
    series = -1 + u * (1 / 2 - u * (1 / 3 - u * (1 / 4 - u * (1 / 5 - u / 6))))
    return jnp.where(low, jnp.log(x_low) / (1 - x_low), jnp.where(near, series, -jnp.log1p(u_mid) / u_mid))


@spence.frule
def spence_frule(tangents, x):
    _, x_dot = tangents
    y = spence(x)
    return y, _tangent("spence", "-", ZeroTangent(), x_dot, y.shape, lambda: _spence_slope(_prepare("spence", x)[0]))
