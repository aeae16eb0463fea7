"""The numerics of `rules.library.linalg`'s norm and normalize: scaled p-norms (no overflow,
no underflow), their (sub)gradients and d/dp, and the zero-safe quotients they share."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero


def _safe_div(a: jax.Array, b: jax.Array) -> jax.Array:
    """a / b, and 0 where b == 0 (the zero subgradient at a kink)."""
    zero = b == 0
    return jnp.where(zero, 0, a / jnp.where(zero, 1, b))


def _unit(x: jax.Array) -> jax.Array:
    """x / |x| elementwise (sign for reals), 0 at 0."""
    return _safe_div(x, jnp.abs(x)).astype(jnp.result_type(x))



_STATIC_ORDS = "None, 'fro', 'nuc', 1, -1, 2, -2, 'inf', '-inf'"


def _dynamic_p(ord: Any) -> bool:
    """Whether ord is a real p that may be differentiated: a float (a traced one included)."""
    if isinstance(ord, (bool, int, str)) or ord is None:
        return False
    return isinstance(ord, (float, np.floating)) or jnp.issubdtype(jnp.result_type(ord), jnp.floating)


def _static_ord(ord: Any) -> Any:
    """A matrix norm's ord as `jnp.linalg.norm` reads it ('inf' -> inf; a concrete float kept)."""
    if isinstance(ord, jax.core.Tracer):
        raise TypeError(
            f"`norm`: a matrix norm needs a static ord ({_STATIC_ORDS}), but got a traced float "
            "(under a JAX transformation a Python float argument is traced, as every differentiable "
            "one is); write an int or a string, e.g. ord=2 or ord='inf'."
        )
    if isinstance(ord, str):
        return {"inf": np.inf, "-inf": -np.inf}.get(ord, ord)
    return float(ord) if _dynamic_p(ord) else ord


def _norm_kind(ndim: int, ord: Any, axis: Any) -> tuple[str, tuple[int, ...], Any]:
    """(kind, reduced axes, ord) as `jnp.linalg.norm` reads ord and axis: kind "fro" (the
    2-norm of the entries), "vector" (static p), "p" (float p, possibly traced) or "matrix"."""
    if axis is None:
        if ord is None:
            return "fro", tuple(range(ndim)), None
        if ndim not in (1, 2):
            raise ValueError(f"`norm`: ord={ord!r} without axis needs a vector or a matrix; got {ndim} dimensions.")
        axes = tuple(range(ndim))
    else:
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(a % ndim for a in axes)
    if len(axes) == 1:
        if _dynamic_p(ord):
            return "p", axes, ord
        ord = _static_ord(ord)
        return ("fro" if ord in (None, 2) else "vector"), axes, ord
    if len(axes) == 2:
        ord = _static_ord(ord)
        return ("fro" if ord in (None, "fro") else "matrix"), axes, ord
    raise ValueError(f"`norm`: axis must name 1 or 2 axes; got {axis!r}.")


def _scaled(a: jax.Array, scale: jax.Array) -> jax.Array:
    """a / scale, with scale 0 read as 1 (then a is 0, or the norm is 0 anyway)."""
    return a / jnp.where(scale == 0, 1, scale)


def _two_norm(a: jax.Array, axes: tuple) -> jax.Array:
    """sqrt(sum a^2) over axes (keepdims), scaled by max a as hypot is: no overflow or underflow."""
    top = jnp.max(a, axis=axes, keepdims=True)
    y = top * jnp.sqrt(jnp.sum(_scaled(a, top) ** 2, axis=axes, keepdims=True))
    return jnp.where(jnp.isinf(top), top, y)


def _p_norm_parts(a: jax.Array, p: Any, axes: tuple) -> tuple[jax.Array, jax.Array]:
    """(scale, s) with (sum a^p)^(1/p) = scale * s over axes (keepdims), for real p, finite or not,
    possibly traced: scale is max a for p > 0 and min a for p < 0, so that every term (a / scale)^p
    is at most 1 (no overflow or underflow); p = +-inf: s = 1 (max / min); p = 0: scale = 1 and s
    the count of nonzero entries. A zero norm has s = 0 or scale = 0."""
    top, bottom = jnp.max(a, axis=axes, keepdims=True), jnp.min(a, axis=axes, keepdims=True)
    finite = jnp.isfinite(p) & (p != 0)
    q = jnp.where(finite, p, 1).astype(a.dtype)
    scale = jnp.where(p == 0, 1, jnp.where(p > 0, top, bottom)).astype(a.dtype)
    s = jnp.sum(_scaled(a, scale) ** q, axis=axes, keepdims=True) ** (1 / q)
    count = jnp.sum(a != 0, axis=axes, keepdims=True).astype(a.dtype)
    return scale, jnp.where(p == 0, count, jnp.where(finite, s, 1)).astype(a.dtype)


def _p_norm(a: jax.Array, p: Any, axes: tuple) -> jax.Array:
    """(sum a^p)^(1/p) over axes (keepdims) for real p, finite or not, a possibly traced, as
    `_p_norm_parts` scales it. p = +-inf: max / min; p = 0: the count of nonzero entries."""
    scale, s = _p_norm_parts(a, p, axes)
    return jnp.where(jnp.isinf(scale), scale, scale * s)


def _norm_value(x: jax.Array, kind: str, axes: tuple, ord: Any) -> jax.Array:
    """The norm over axes, keepdims: scaled where `jnp.linalg.norm` squares (2-norms, p-norms)."""
    a = jnp.abs(x)
    if kind == "fro":
        return _two_norm(a, axes)
    if kind == "p" or (kind == "vector" and ord not in (0, 1)):
        return _p_norm(a, ord, axes)
    if kind == "vector":
        return jnp.sum(a != 0, axis=axes, keepdims=True).astype(a.dtype) if ord == 0 else jnp.sum(a, axes, keepdims=True)
    return jnp.linalg.norm(x, ord=ord, axis=axes, keepdims=True)


def _shared_max(x: jax.Array, a: jax.Array, y: jax.Array, axes: tuple) -> jax.Array:
    """The least-norm subgradient of max (min) a over axes at y: the ties share it equally."""
    hit = a == y
    return _safe_div(_unit(x) * hit, jnp.sum(hit, axis=axes, keepdims=True).astype(a.dtype))


def _p_gradient(x: jax.Array, a: jax.Array, p: Any, y: jax.Array, axes: tuple) -> jax.Array:
    """d y / d x for y = ||x||_p, p real (traced or not): unit(x) (a / y)^(p - 1); 0 at a = 0
    and wherever y = 0 (the zero subgradient); ties share max / min for p = +-inf; 0 for p = 0."""
    finite = jnp.isfinite(p) & (p != 0)
    q = jnp.where(finite, p, 2).astype(a.dtype)
    if jnp.iscomplexobj(x):
        g = _complex_p_gradient(x, a, q, y)
    else:
        # sign(t) |t|^(q - 1), t = x / y, by `_signed_power`, so that its own derivative at a zero
        # entry is right: (q - 1) |t|^(q - 2) = 1 at p = 2, 0 for p > 2, inf for 1 < p < 2. Only
        # where it is singular is it masked (input and output, so that no 0 * inf reaches the
        # tangents): y = 0, and zero entries for p <= 1 (sign's jump; |t|^(q - 1) infinite for p < 1)
        singular = (y == 0) | ((a == 0) & (q <= 1))
        t = jnp.where(singular, 1, _safe_div(x, y))
        g = jnp.where(singular, 0, _signed_power(t, q - 1)).astype(a.dtype)
    return jnp.where(finite, g, jnp.where(p == 0, 0, _shared_max(x, a, y, axes)))


def _complex_p_gradient(x: jax.Array, a: jax.Array, q: jax.Array, y: jax.Array) -> jax.Array:
    """unit(x) (a / y)^(q - 1) = (x / y) |x / y|^(q - 2) for complex x (a = |x|, y the norm), its
    own derivative right at a zero entry: 1 / y at q = 2, 0 for q > 2 (|x / y|^(q - 2) is 1, 0
    there), infinite for 1 < q < 2 (`_steep_zero`: NaN across entries), 0 for q <= 1 (sign's
    jump; the zero subgradient). Masking the entry (0 there, as before) made it 0 at every q.
    Every branch is finite where it is not selected, so no 0 * inf reaches reverse mode."""
    zero, nil = a == 0, y == 0
    r = jnp.where(zero | nil, 1, _safe_div(a, y))
    power = jnp.where(zero, _abs_power(jnp.zeros_like(a), jnp.maximum(q, 2) - 2), _abs_power(r, q - 2))
    g = _safe_div(x, y) * power.astype(a.dtype)
    g = jnp.where(zero & (q < 2), _steep_zero(x, zero & (q > 1) & (q < 2) & ~nil), g)
    return jnp.where(nil, 0, g)


@jax.custom_jvp
def _steep_zero(x: jax.Array, steep: jax.Array) -> jax.Array:
    """Zeros like x whose slope in x is infinite where `steep`, 0 elsewhere: the value at t = 0 of
    t |t|^(e - 1), 0 < e < 1, whose derivative there is infinite (inf * x_dot: NaN where x_dot is 0)."""
    return jnp.zeros_like(x)


@_steep_zero.defjvp
def _steep_zero_jvp(primals, tangents):
    (x, steep), (x_dot, _) = primals, tangents
    return jnp.zeros_like(x), jnp.where(steep, np.inf, 0).astype(x_dot.dtype) * x_dot


def _power_tangent(t, e, t_dot, e_dot, value, slope):
    """The tangent of |t|^e or sign(t) |t|^e (value): slope(t, e) t_dot + value log|t| e_dot (0 at
    t = 0); an unperturbed argument (a symbolic zero) adds nothing, not 0 * inf."""
    out = jnp.zeros_like(value)
    if not isinstance(t_dot, SymbolicZero):
        flat = (e == 0) & (t == 0)  # sign's and 1's slope: 0 (not 0 * |0|^-1 = NaN)
        out = out + jnp.where(flat, 0, e * slope(t, jnp.where(flat, 1, e) - 1)) * t_dot
    if not isinstance(e_dot, SymbolicZero):
        zero = t == 0
        out = out + jnp.where(zero, 0, value * jnp.log(jnp.abs(jnp.where(zero, 1, t)))) * e_dot
    return out


@jax.custom_jvp
def _signed_power(t: jax.Array, e: jax.Array) -> jax.Array:
    """sign(t) |t|^e for real t (0 at t = 0 for e >= 0), whose derivatives are right at t = 0 to
    every order where they exist: e |t|^(e - 1) by `_abs_power` (1 at e = 1: t itself), 0 at
    e = 0 (sign's, away from its jump). JAX's sign(t) * |t|**e has 0 there (both factors' slopes
    are 0 at 0, and the product rule misses that sign(t) |t| = t)."""
    return jnp.sign(t) * jnp.abs(t) ** e


@jax.custom_jvp
def _abs_power(t: jax.Array, e: jax.Array) -> jax.Array:
    """|t|^e for real t, its slope e sign(t) |t|^(e - 1) by `_signed_power` (0 at e = 0)."""
    return jnp.abs(t) ** e


def _signed_power_jvp(primals, tangents):
    (t, e), (t_dot, e_dot) = primals, tangents
    value = _signed_power(t, e)
    return value, _power_tangent(t, e, t_dot, e_dot, value, _abs_power)


def _abs_power_jvp(primals, tangents):
    (t, e), (t_dot, e_dot) = primals, tangents
    value = _abs_power(t, e)
    return value, _power_tangent(t, e, t_dot, e_dot, value, _signed_power)


_signed_power.defjvp(_signed_power_jvp, symbolic_zeros=True)
_abs_power.defjvp(_abs_power_jvp, symbolic_zeros=True)


def _p_partial(a: jax.Array, p: Any, y: jax.Array, axes: tuple) -> jax.Array:
    """d y / d p for y = (sum a^p)^(1/p): (y / p) sum (a / y)^p log(a / y) (keepdims).

    From log y = log(sum a^p) / p: d log y / dp = (sum a^p log a / sum a^p - log y) / p, and
    a^p / sum a^p = (a / y)^p. Each term has a / y <= 1 for p > 0 (>= 1 for p < 0), so (a / y)^p
    <= 1: stable. Terms with a = 0 are 0 (their limit); y = 0 (x = 0, or p < 0 with a zero entry:
    y is 0 for every such p) gives 0; p = +-inf gives 0 (the limit). At p = 0 the norm jumps
    (the count of nonzero entries there, infinite as p -> 0+ for two or more): NaN, unless x = 0.
    """
    r = _safe_div(a, y)
    finite = jnp.isfinite(p) & (p != 0)
    q = jnp.where(finite, p, 1).astype(a.dtype)
    vanish = (r == 0) | jnp.isinf(r)  # a = 0 (p > 0), or a / y beyond the range (p < 0): 0
    terms = jnp.where(vanish, 0, r**q * jnp.log(jnp.where(vanish, 1, r)))
    dp = jnp.where(finite & (y != 0), y / q * jnp.sum(terms, axis=axes, keepdims=True), 0)
    return jnp.where((p == 0) & (y != 0), np.nan, dp).astype(a.dtype)


def _norm_gradient(x: jax.Array, ord: Any, kind: str, axes: tuple, y: jax.Array) -> jax.Array:
    """A (sub)gradient of the norm w.r.t. x, y (keepdims) the norm; 0 where y == 0."""
    ax = jnp.abs(x)
    if kind == "fro":
        return _safe_div(x, y)
    if kind == "p":
        return _p_gradient(x, ax, ord, y, axes)
    if kind == "vector":
        if ord == 0:
            return jnp.zeros_like(x)
        if ord == 1:
            return _unit(x)
        if ord in (np.inf, -np.inf):
            return _shared_max(x, ax, y, axes)
        return _p_gradient(x, ax, ord, y, axes)
    row, col = axes
    if ord in (1, -1, np.inf, -np.inf):
        # max/min over one axis of the absolute sums over the other
        summed, kept = (row, col) if ord in (1, -1) else (col, row)
        sums = jnp.sum(ax, axis=summed, keepdims=True)
        # the extreme of these very sums, not y: a reduction in another order (GPU, vmap) may
        # differ from them in the last bit, and then no column would match and the gradient be 0
        hit = sums == (jnp.max if ord > 0 else jnp.min)(sums, axis=kept, keepdims=True)
        return _safe_div(_unit(x) * hit, jnp.sum(hit, axis=kept, keepdims=True).astype(ax.dtype))
    xm = jnp.moveaxis(x, (row, col), (-2, -1))
    if ord == "nuc" and not jnp.iscomplexobj(x):
        return jnp.moveaxis(_nuclear_gradient(xm), (-2, -1), (row, col))
    # complex A, ord +-2: by the svd primitive, whose rules differentiate the pullback in either
    # mode (NaN at ties, where the second derivative is not determined); a custom_jvp of the
    # frame tests its tangent for NaN, which reverse mode cannot transpose (jacrev of jacrev)
    from .linalg_spectral import svd

    u, s, vt = svd(xm)
    if ord == "nuc":  # U_r V_r^H over the nonzero singular values: the least-norm subgradient
        keep = (s > jnp.finfo(s.dtype).eps * s.shape[-1] * s[..., :1]).astype(u.dtype)
        g = (u * keep[..., None, :]) @ vt
    elif ord in (2, -2):  # the singular vectors of the largest / smallest singular value
        k = 0 if ord == 2 else s.shape[-1] - 1  # not -1: the slice -1:0 is empty (the gradient was 0)
        g = u[..., :, k : k + 1] @ vt[..., k : k + 1, :]
    else:
        raise ValueError(f"`norm`: unsupported matrix norm ord={ord!r}; expected one of {_STATIC_ORDS}.")
    return jnp.where(y == 0, 0, jnp.moveaxis(g, (-2, -1), (row, col)))


def _kept(s: jax.Array) -> jax.Array:
    """1 for the singular values of a matrix scaled to max |a_ij| = 1 (so s_max in [1, sqrt(mn)])
    that are not rounding noise, else 0: a static elementwise f for `svd_matrix_function`."""
    return (s > jnp.finfo(s.dtype).eps * s.shape[-1]).astype(s.dtype)


def _nuclear_gradient(A: jax.Array) -> jax.Array:
    """U_r V_r^T over the nonzero singular values of a real A (..., m, n), the least-norm
    subgradient of the nuclear norm, as `svd_matrix_function` of A / max|a_ij| (U_r V_r^T does
    not change with the scale, nor does its derivative along A itself, so the scale is held):
    its derivative, the nuclear norm's second, is exact where singular values repeat (the
    polar factor's at a full-rank A; A = I among them), where the SVD's frame gives NaN.
    Its JAX function, not the primitive: a pullback that calls a primitive has no forward
    mode under the fallback lowering (ZYGOTE_JAX_LOWERING=custom_vjp)."""
    from .linalg_matfun import _svd_function

    top = jax.lax.stop_gradient(jnp.max(jnp.abs(A), axis=(-2, -1), keepdims=True))
    return _svd_function(A / jnp.where(top == 0, 1, top).astype(A.dtype), _kept, None)[0]


# ----- normalize ----------------------------------------------------------------------------
def _normalized(x: jax.Array, axis: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(y, top, s): y = x / ||x|| (0 where ||x|| = 0), ||x|| = top * s with top = max|x| and s in
    [1, sqrt(n)] (keepdims): scaled, so that neither |x|^2 nor ||x|| need be representable."""
    top = jnp.max(jnp.abs(x), axis=axis, keepdims=True)
    xs = _scaled(x, top)
    s = jnp.sqrt(jnp.sum(jnp.abs(xs) ** 2, axis=axis, keepdims=True))
    return _safe_div(xs, s).astype(jnp.result_type(x)), top, s


def _p_normalized(x: jax.Array, p: Any, axes: tuple) -> tuple:
    """(y, n, scale, s): y = x / n for n = ||x||_p over axes (keepdims, = scale * s as
    `_p_norm_parts` scales it), 0 where n = 0."""
    scale, s = _p_norm_parts(jnp.abs(x), p, axes)
    return _divide_by_norm(x, scale, s), jnp.where(jnp.isinf(scale), scale, scale * s), scale, s


def _divide_by_norm(v: jax.Array, top: jax.Array, s: jax.Array) -> jax.Array:
    """v / ||x|| with ||x|| = top * s, in two steps (||x|| itself may overflow); 0 where it is 0."""
    return _safe_div(_safe_div(v, top), s).astype(jnp.result_type(v))
