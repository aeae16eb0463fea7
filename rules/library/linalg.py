"""Linear algebra primitives: norms, determinants and inverses.

Each function is a `primitive` with an frule (forward mode: `jax.jvp`, `jax.jacfwd`) and an
rrule (reverse mode), both reusing what the forward pass computed (an LU, the output itself)
and finite where plain JAX autodiff is not (norms at 0). Complex arguments use ChainRules'
convention: for a real loss l, x_bar = dl/dRe x + i dl/dIm x; tangents are plain.
Matrices are the last two axes; leading axes are batch axes. Solves and factorisations are
in `rules.library.linalg_solve`; eigen- and singular value decompositions in
`rules.library.linalg_spectral`; functions of Hermitian matrices in
`rules.library.linalg_matfun`. The private helpers and examples here are shared by all;
the norms' numerics are in `rules.library._norms`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

from .._primitive import primitive
from .._projection import ProjectTo
from .._thunks import unthunk
from .._zeros import AbstractZero, NoTangent, ZeroTangent
from ._norms import (_divide_by_norm, _dynamic_p, _norm_gradient, _norm_kind, _norm_value, _normalized, _p_normalized,
                     _p_partial)
from ._norms import _unit

__all__ = ["norm", "normalize", "det", "logdet", "slogdet", "inv", "pinv"]

# ----- example inputs (small, well conditioned, distinct singular values) -------------------
_V3 = np.array([0.6, -1.2, 0.9])
_V3Z = np.array([0.6 - 0.3j, -1.2 + 0.5j, 0.2 + 0.9j])
_M3 = np.array([[2.0, 0.5, -0.3], [0.1, 1.5, 0.4], [-0.2, 0.3, 1.0]])
_M3Z = _M3 + 1j * np.array([[0.3, -0.1, 0.2], [0.0, 0.2, -0.4], [0.1, 0.1, -0.2]])
_M43 = np.array([[1.0, 0.2, -0.5], [0.3, 2.0, 0.1], [-0.4, 0.6, 1.5], [0.2, -0.1, 0.3]])
_SPD3 = _M3 @ _M3.T + np.eye(3)
# Hermitian, with distinct, well separated eigenvalues (linalg_spectral, linalg_matfun)
_Q3 = np.linalg.qr(np.array([[1.0, 0.4, -0.3], [0.2, -1.1, 0.5], [0.6, 0.3, 0.9]]))[0]
_S3 = _Q3 @ np.diag([0.5, 1.5, 3.0]) @ _Q3.T  # symmetric positive definite
_S3Z = np.array([[2.0, 0.5 - 0.3j, 0.1j], [0.5 + 0.3j, 1.0, -0.2], [-0.1j, -0.2, 3.0]])


# ----- helpers ------------------------------------------------------------------------------
def _mT(x: jax.Array) -> jax.Array:
    return jnp.swapaxes(x, -1, -2)


def _H(x: jax.Array) -> jax.Array:
    """The conjugate transpose of the last two axes."""
    return jnp.conj(_mT(x))


def _herm(x: jax.Array) -> jax.Array:
    """The Hermitian (for real: symmetric) part of the last two axes."""
    return (x + _H(x)) / 2


def _diag(d: jax.Array) -> jax.Array:
    """Diagonal matrices from vectors along the last axis."""
    return d[..., :, None] * jnp.eye(d.shape[-1], dtype=d.dtype)[(None,) * (d.ndim - 1)]


def _sandwich(V: jax.Array, inner: jax.Array, W: jax.Array | None = None) -> jax.Array:
    """V inner W^H (W defaults to V)."""
    return V @ inner.astype(V.dtype) @ _H(V if W is None else W)


def _nots(n: int) -> tuple:
    """NoTangent() for each of n static positional arguments."""
    return (NoTangent(),) * n


def _is_zero(t: Any) -> bool:
    return isinstance(t, AbstractZero)


def _pushed(pushforward: Any, *dots: Any) -> Any:
    """pushforward(*dots), the tangents unthunked, or ZeroTangent() when no argument moves."""
    dots = tuple(unthunk(d) for d in dots)
    return ZeroTangent() if all(map(_is_zero, dots)) else pushforward(*dots)


# ----- norm ---------------------------------------------------------------------------------
@primitive(examples=[(_V3Z,), (_V3.astype(np.float32), 3), (_M3, "nuc"), (_M43, "inf", (1, 0)),
                     (_V3, 2.5), (_V3Z, 0.5), (_M43.astype(np.float32), 1.5, 0), (_M3, -2)])
def norm(x: jax.Array, ord: Any = None, axis: Any = None, keepdims: bool = False) -> jax.Array:
    """Vector or matrix norm, as `jnp.linalg.norm`, scaled (no overflow, no underflow), with a
    zero subgradient at 0 and a differentiable float p.

    Why a rule: at x = 0 the derivative of |x| involves x / |x| = 0/0, and JAX returns NaN
    (every ord, e.g. `jax.grad(jnp.linalg.norm)(jnp.zeros(3))`); the rule returns the zero
    subgradient. At kinks (ties in max-norms, zero entries for ord=1, rank-deficient
    nuclear norms) it returns the least-norm subgradient (ties share the seed equally).
    2-norms and p-norms are computed scaled by max|x| (by min|x| for p < 0), as `jnp.hypot`
    is, where `jnp.linalg.norm` squares: at x = [3e-170, 4e-170] JAX's norm is 0 and its
    gradient [0, 0] (true: 5e-170, [0.6, 0.8]); float32 [3e20, 4e20] gives inf (true 5e20).
    A float ord is the p of a vector p-norm, differentiated as ChainRules' `norm(x, p)` is
    (d/dp = (y / p) sum (|x_i| / y)^p log(|x_i| / y)); it may be traced (under a JAX
    transformation a Python float argument is), including p = +-inf (max / min |x|,
    d/dp = 0) and p = 0 (the count of nonzero entries, d/dp NaN: the norm jumps there;
    ChainRules returns 0). Zero entries of x get 0 for every p (ChainRules' convention also
    for 0 < p < 1, where |x_i|^p has no derivative at 0); the gradient's own derivative there is
    the true one (real x): 1 / y at p = 2, 0 for p > 2, inf for 1 < p < 2. Matrix norms need a
    static ord. The real nuclear norm's second derivative is exact where singular values
    repeat (its gradient U V^T is `svd_matrix_function`'s of a step f: the polar factor's
    derivative at a full-rank A, A = I among them); with the rank held at a rank-deficient
    A; for complex A and ord +-2 it is NaN at ties.

    Args:
      x: an array.
      ord: as `jnp.linalg.norm`: None, an int or a float p, or +-inf / "inf" / "-inf"
        (vectors); None, "fro", "nuc", +-1, +-2, +-inf / "inf" / "-inf" (matrices, static).
        An int is static; a float is differentiable (vector norms).
      axis: None, an int (vector norm) or a pair of ints (matrix norm).
      keepdims: keep the reduced axes with size 1.

    Returns:
      The norm(s), real.

    Raises:
      TypeError: a matrix norm with a traced ord.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.linalg import norm
    >>> jax.grad(norm)(jnp.zeros(3)).tolist()
    [0.0, 0.0, 0.0]
    >>> jax.grad(norm)(jnp.array([3.0, 4.0])).round(6).tolist()
    [0.6, 0.8]
    >>> float(norm(jnp.array([3e20, 4e20])))
    5e+20
    >>> round(float(jax.grad(norm, argnums=1)(jnp.array([3.0, 4.0]), 2.0)), 6)  # d/dp at p = 2
    -0.816773

    See also: `normalize`, `jnp.linalg.norm`, `jnp.hypot`.
    """
    kind, axes, ord = _norm_kind(jnp.ndim(x), ord, axis)
    y = _norm_value(x, kind, axes, ord)
    return y if keepdims else jnp.squeeze(y, axes)


def _norm_options(ord: Any = None, axis: Any = None, keepdims: bool = False) -> tuple:
    return ord, axis, keepdims


def _norm_forward(x: jax.Array, options: tuple, kw_options: dict):
    """(y, y with the reduced axes kept, kind, axes, ord, whether ord is a positional float p)."""
    ord, axis, keepdims = _norm_options(*options, **kw_options)
    kind, axes, ord = _norm_kind(jnp.ndim(x), ord, axis)
    y_kept = _norm_value(x, kind, axes, ord)
    return (y_kept if keepdims else jnp.squeeze(y_kept, axes)), y_kept, kind, axes, ord, keepdims


@norm.frule
def norm_frule(tangents, x, *options, **kw_options):
    _, x_dot, *option_dots = tangents
    y, y_kept, kind, axes, ord, keepdims = _norm_forward(x, options, kw_options)
    p_dot = option_dots[0] if option_dots and kind == "p" else ZeroTangent()

    def norm_pushforward(x_dot, p_dot):  # Re <grad, x_dot> over the reduced axes, + dy/dp p_dot
        y_dot = jnp.zeros_like(y_kept)
        if not _is_zero(x_dot):
            grad = _norm_gradient(x, ord, kind, axes, y_kept)
            y_dot = y_dot + jnp.sum(jnp.real(jnp.conj(grad) * x_dot), axis=axes, keepdims=True)
        if not _is_zero(p_dot):
            y_dot = y_dot + _p_partial(jnp.abs(x), ord, y_kept, axes) * jnp.real(p_dot)
        return (y_dot if keepdims else jnp.squeeze(y_dot, axes)).astype(y.dtype)

    return y, _pushed(norm_pushforward, x_dot, p_dot)


@norm.rrule
def norm_rrule(x, *options, **kw_options):
    project_x = ProjectTo(x)
    y, y_kept, kind, axes, ord, keepdims = _norm_forward(x, options, kw_options)
    differentiates_p = bool(options) and kind == "p"
    project_p = ProjectTo(options[0]) if differentiates_p else None

    def norm_pullback(y_bar):
        y_bar = unthunk(y_bar)
        rest = _nots(max(len(options) - 1, 0))
        if _is_zero(y_bar):
            p_bar = (ZeroTangent() if differentiates_p else NoTangent(),) if options else ()
            return (NoTangent(), ZeroTangent()) + p_bar + rest
        y_bar = y_bar if keepdims else jnp.expand_dims(y_bar, axes)
        x_bar = project_x(y_bar * _norm_gradient(x, ord, kind, axes, y_kept))
        if not options:
            return NoTangent(), x_bar
        if differentiates_p:  # p is one scalar: the seeds of every norm summed
            p_bar = project_p(jnp.sum(jnp.real(y_bar) * _p_partial(jnp.abs(x), ord, y_kept, axes)))
        else:
            p_bar = NoTangent()
        return (NoTangent(), x_bar, p_bar) + rest

    return y, norm_pullback


# ----- normalize ----------------------------------------------------------------------------
@primitive(examples=[(_V3Z,), (_M43.astype(np.float32), 1), (_V3, None, 2.5), (_V3Z, None, np.inf)])
def normalize(x: jax.Array, axis: int | tuple[int, ...] | None = None, p: Any = 2) -> jax.Array:
    """x / ||x||_p (over all entries, or along `axis`), and 0 where ||x||_p = 0.

    Why a rule: x / jnp.linalg.norm(x) is NaN at 0 and so is its gradient; here the value
    and the cotangent are 0 there. For p = 2 the pullback is one projection,
    (y_bar - y Re<y, y_bar>) / ||x||; for other p, y_bar / ||x|| + n_bar g, with
    n_bar = -Re<y, y_bar> / ||x|| and g the gradient of `norm` (ChainRules' `normalize(x, p)`).
    Computed scaled by max|x| (min|x| for p < 0): at [3e-170, 4e-170] (float64) plain JAX's
    x / norm(x) is [inf, inf] (float32 [3e20, 4e20]: [0, 0]), here [0.6, 0.8] and the right
    pullback.

    Args:
      x: an array (real or complex).
      axis: None (all entries) or the axis/axes to normalise along.
      p: the norm's p, as `norm`'s vector ord: an int is static; a float (+-inf included) is
        differentiated when passed positionally, as ChainRules' `normalize(x, p)` is.

    Returns:
      An array of x's shape with unit p-norm (or 0) along `axis`.

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg import normalize
    >>> normalize(jnp.array([3.0, 4.0])).round(6).tolist(), normalize(jnp.zeros(2)).tolist()
    ([0.6, 0.8], [0.0, 0.0])
    >>> normalize(jnp.array([3.0, -1.0]), None, 1).tolist()
    [0.75, -0.25]

    See also: `norm`.
    """
    axes, p, _ = _normalize_options(jnp.ndim(x), axis, p)
    return _normalized(x, axes)[0] if _two(p) else _p_normalized(x, p, axes)[0]


def _two(p: Any) -> bool:
    """Whether p is the static 2 of the projection formula (a float p is differentiated)."""
    return isinstance(p, int) and not isinstance(p, bool) and p == 2


def _normalize_options(ndim: int, axis: Any = None, p: Any = 2) -> tuple:
    """(axes, p, whether p is a differentiable float), the axes a tuple (None: all)."""
    axes = tuple(range(ndim)) if axis is None else ((axis,) if isinstance(axis, int) else tuple(axis))
    return tuple(a % max(ndim, 1) for a in axes), p, _dynamic_p(p)


def _normalize_forward(x, options, kw_options):
    """(y, n, scale, s, axes, p, dynamic): y = x / n, n = scale * s (keepdims)."""
    axes, p, dynamic = _normalize_options(jnp.ndim(x), *options, **kw_options)
    if _two(p):
        y, scale, s = _normalized(x, axes)
        return y, None, scale, s, axes, p, dynamic
    y, n, scale, s = _p_normalized(x, p, axes)
    return y, n, scale, s, axes, p, dynamic


def _normalize_tangent(x, y, n, scale, s, axes, p, direction, p_dir=None):
    """normalize's pushforward: (v - y dn) / n with dn = Re<g, v> (+ dn/dp p_dir), g the norm's
    gradient (y for p = 2)."""
    g = y if n is None else _norm_gradient(x, p, "p", axes, n)
    dn = jnp.sum(jnp.real(jnp.conj(g) * direction), axis=axes, keepdims=True)
    if p_dir is not None:
        dn = dn + _p_partial(jnp.abs(x), p, n, axes) * jnp.real(p_dir)
    return _divide_by_norm(direction - y * dn, scale, s).astype(y.dtype)


@normalize.frule
def normalize_frule(tangents, x, *options, **kw_options):
    _, x_dot, *option_dots = tangents
    y, n, scale, s, axes, p, dynamic = _normalize_forward(x, options, kw_options)
    p_dot = option_dots[1] if len(option_dots) > 1 and dynamic else ZeroTangent()

    def normalize_pushforward(x_dot, p_dot):  # for p = 2 a projection, which is self-adjoint
        x_dot = jnp.zeros_like(x) if _is_zero(x_dot) else x_dot
        return _normalize_tangent(x, y, n, scale, s, axes, p, x_dot, None if _is_zero(p_dot) else p_dot)

    return y, _pushed(normalize_pushforward, x_dot, p_dot)


@normalize.rrule
def normalize_rrule(x, *options, **kw_options):
    project_x = ProjectTo(x)
    y, n, scale, s, axes, p, dynamic = _normalize_forward(x, options, kw_options)
    differentiates_p = len(options) > 1 and dynamic
    project_p = ProjectTo(options[1]) if differentiates_p else None

    def normalize_pullback(y_bar):
        y_bar = unthunk(y_bar)
        if _is_zero(y_bar):
            p_bar = (ZeroTangent(),) if differentiates_p else ()
            return (NoTangent(), ZeroTangent()) + _nots(len(options) - len(p_bar)) + p_bar
        # n_bar = -Re<y, y_bar> / n; x_bar = y_bar / n + n_bar g (g = y for p = 2)
        inner = jnp.sum(jnp.real(jnp.conj(y) * y_bar), axis=axes, keepdims=True)
        g = y if n is None else _norm_gradient(x, p, "p", axes, n)
        x_bar = project_x(_divide_by_norm(y_bar - g * inner, scale, s))
        if not differentiates_p:
            return (NoTangent(), x_bar) + _nots(len(options))
        p_bar = -jnp.sum(_divide_by_norm(inner * _p_partial(jnp.abs(x), p, n, axes), scale, s))
        return NoTangent(), x_bar, NoTangent(), project_p(p_bar)

    return y, normalize_pullback


# ----- det ----------------------------------------------------------------------------------
def _exclusive_prod(s: jax.Array) -> jax.Array:
    """p_i = prod_{j != i} s_j along the last axis, without dividing (exact for zeros)."""
    ones = jnp.ones_like(s[..., :1])
    before = jnp.cumprod(jnp.concatenate([ones, s[..., :-1]], axis=-1), axis=-1)
    after = jnp.flip(jnp.cumprod(jnp.concatenate([ones, jnp.flip(s[..., 1:], -1)], axis=-1), axis=-1), -1)
    return before * after


def _unitary(q: jax.Array) -> jax.Array:
    """q made exactly unitary, column by column: a column orthonormal to the ones before it is
    kept (to rounding), any other (zero, garbage) is replaced by a completing unit vector.

    Gram-Schmidt, each projection done twice ("twice is enough"), a column with nothing left
    after them replaced by the residual of the basis vector e_k whose row of the columns so far
    has the least norm (its residual's squared norm is at least 1 - j/n). The result is what a
    Householder QR with R's diagonal made positive gives, without a QR: JAX's QR fails under
    `jax.jit` with an explicit-axes `NamedSharding` (its lowering's masks lose the batch axes'
    sharding), which these batched products, norms and selects keep.
    """
    n = q.shape[-1]
    real = jnp.finfo(q.dtype).dtype
    tiny = jnp.asarray(n * jnp.finfo(real).eps, real)

    def project(Q, v):  # v minus its components along Q's columns (the unfilled ones are 0)
        for _ in range(2):
            v = v - jnp.einsum("...ik,...k->...i", Q, jnp.einsum("...ik,...i->...k", jnp.conj(Q), v))
        return v

    def norm(v):
        return jnp.sqrt(jnp.sum(jnp.abs(v) ** 2, axis=-1, keepdims=True))

    def column(j, Q):
        v = jax.lax.dynamic_index_in_dim(q, j, axis=-1, keepdims=False)
        r = project(Q, v)
        k = jnp.argmin(jnp.sum(jnp.abs(Q) ** 2, axis=-1), axis=-1)
        e = project(Q, (jnp.arange(n).reshape((1,) * k.ndim + (n,)) == k[..., None]).astype(q.dtype))
        w = jnp.where(norm(r) > tiny * norm(v), r, e)
        return jax.lax.dynamic_update_index_in_dim(Q, w / norm(w), j, axis=-1)

    return jax.lax.fori_loop(0, n, column, jnp.zeros_like(q))


def _pair_exclusive_prod(s: jax.Array) -> jax.Array:
    """q_ij = prod_{k != i, j} s_k for i != j, q_ii = 0, along the last axis, without dividing."""
    eye = jnp.eye(s.shape[-1], dtype=bool)
    return jnp.where(eye, 0, _exclusive_prod(jnp.where(eye, 1, s[..., None, :])))


def _svd_frame(A: jax.Array) -> tuple:
    """(U, s, V, det(U V^H)) for A = U diag(s) V^H, U and V completed to unitary matrices."""
    u, s, vh = jnp.linalg.svd(A)
    u, v = _unitary(u), _unitary(_H(vh))
    return u, s, v, jnp.linalg.det(u) * jnp.conj(jnp.linalg.det(v))  # unitary factors: |det| = 1


def _adjugate_in(frame: tuple) -> jax.Array:
    u, s, v, phase = frame
    return phase[..., None, None] * _sandwich(v, _diag(_exclusive_prod(s).astype(u.dtype)), u)


@jax.custom_jvp
def _adjugate(A: jax.Array) -> jax.Array:
    """adj(A) = det(A) A^{-1} = det(U V^H) V diag(prod_{j != i} s_j) U^H, from A = U S V^H.

    Exact at singular A too, whatever the backend's SVD returns as singular vectors of zero
    singular values (a one-sided Jacobi SVD, as on GPUs, returns U's as zero vectors): at
    rank n-1 the adjugate is made of exactly those vectors, so U and V are completed to
    unitary matrices first (`_unitary`); any completion gives the same adjugate.
    """
    return _adjugate_in(_svd_frame(A))


@_adjugate.defjvp
def _adjugate_jvp(primals, tangents):
    frame = _held_svd_frame(primals[0])
    return _adjugate_in(frame), _adjugate_dot(frame, *tangents)


def _adjugate_dot(frame: tuple, A_dot: jax.Array) -> jax.Array:
    """The derivative of adj along A_dot at A = U diag(s) V^H, exact everywhere, without dividing.

    adj is a polynomial, and A + t A_dot = U (S + t C) V^H with C = U^H A_dot V, so
    adj(A + t A_dot) = det(U V^H) V adj(S + t C) U^H exactly, U and V held. d adj(S)[C] of the
    diagonal S has C_kk prod_{j != i, k} s_j summed over k != i on the diagonal and
    -C_ij prod_{k != i, j} s_k off it. So `det`'s second derivatives are exact where the SVD's
    own derivative divides by 0 or drops the term (repeated or zero singular values).
    """
    u, s, v, phase = frame
    q, C = _pair_exclusive_prod(s).astype(u.dtype), _H(u) @ A_dot @ v
    return phase[..., None, None] * _sandwich(v, _diag(jnp.einsum("...ik,...kk->...i", q, C)) - q * C, u)


@jax.custom_jvp
def _held_svd_frame(A: jax.Array) -> tuple:
    """`_svd_frame`, not to be differentiated: the frame of adj's derivative (a third one raises)."""
    return _svd_frame(A)


@_held_svd_frame.defjvp
def _held_svd_frame_jvp(primals, tangents):
    raise NotImplementedError(
        "`det` (rules.library.linalg): derivatives of order three and higher are not implemented "
        "(its second derivative is exact everywhere; differentiating the SVD it is built from "
        "once more is not: NaN or wrong at repeated singular values). For a third derivative at "
        "nonsingular matrices, differentiate `jnp.linalg.det` or `exp(logdet(A))` instead."
    )


@primitive(examples=[(_M3.astype(np.float32),), (_M3Z,)])
def det(A: jax.Array) -> jax.Array:
    """The determinant of the square matrix (or matrices) A, with the adjugate as cotangent.

    Why a rule: d det(A) = tr(adj(A) dA), and the adjugate is computed from an SVD with
    products of all-but-one singular values, never as det(A) * inv(A), so the gradient is
    exact at singular matrices (rank n-1: a rank-one adjugate; lower rank: 0) on every
    backend: nothing depends on exact zeros (pivots, singular values) or on the singular
    vectors the backend returns for zero singular values. JAX's own det rule also handles
    rank n-1 (by a cofactor solve); this one agrees with it there. Second derivatives are
    exact too (the adjugate's derivative in the SVD's frame, without dividing), also at
    repeated singular values: at the identity, at rank n-1 and below, where JAX's are NaN or
    wrong; derivatives of order three raise NotImplementedError.

    Args:
      A: an array (..., n, n), real or complex.

    Returns:
      det(A), shape (...).

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.linalg import det
    >>> jax.grad(det)(jnp.array([[1.0, 2.0], [2.0, 4.0]])).round(6).tolist()
    [[4.0, -2.0], [-2.0, 1.0]]

    See also: `slogdet`, `logdet`.
    """
    return jnp.linalg.det(A)


@det.frule
def det_frule(tangents, A):
    _, A_dot = tangents
    y = jnp.linalg.det(A)

    def det_pushforward(A_dot):  # tr(adj(A) A_dot), exact at singular A
        return jnp.sum(_mT(_adjugate(A)) * A_dot, axis=(-2, -1))

    return y, _pushed(det_pushforward, A_dot)


@det.rrule
def det_rrule(A):
    project_A = ProjectTo(A)
    y = jnp.linalg.det(A)

    def det_pullback(y_bar):
        y_bar = unthunk(y_bar)
        return NoTangent(), project_A(jnp.asarray(y_bar)[..., None, None] * _H(_adjugate(A)))

    return y, det_pullback


# ----- slogdet and logdet: one LU, reused -----------------------------------------------------
def _lu_slogdet(A: jax.Array) -> tuple[tuple, jax.Array, jax.Array]:
    """((lu, piv), sign, log|det|) of square matrices from one LU factorisation."""
    lu, piv = jsl.lu_factor(A)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    swaps = jnp.sum(piv != jnp.broadcast_to(jnp.arange(piv.shape[-1], dtype=piv.dtype), piv.shape), axis=-1)
    parity = jnp.where(swaps % 2 == 0, 1, -1).astype(A.dtype)
    sign = parity * jnp.prod(_unit(diag), axis=-1)
    return (lu, piv), sign, jnp.sum(jnp.log(jnp.abs(diag)), axis=-1)


def _trace_solve(factors: tuple, A_dot: jax.Array) -> jax.Array:
    """tr(A^{-1} A_dot) from A's LU factors: the derivative of log det A."""
    return jnp.trace(jsl.lu_solve(factors, A_dot), axis1=-2, axis2=-1)


def _inv_H(factors: tuple, A: jax.Array) -> jax.Array:
    """A^{-H} from A's LU factors."""
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    return jsl.lu_solve(factors, eye, trans=2 if jnp.iscomplexobj(A) else 1)


@primitive(examples=[(_M3Z,), (_M3.astype(np.float32) * np.array([[-1.0], [1.0], [1.0]], np.float32),)])
def slogdet(A: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(sign, log|det A|) of square matrices, from one LU reused by the pullback.

    Why a rule: the pullback is A^{-H} from the forward pass's LU factors (one solve, no
    refactorisation, no differentiation through the LU); the sign of a real matrix is
    locally constant and gets no cotangent; the unit-modulus sign of a complex one gets
    its exact cotangent, -i Im(conj(sign_bar) sign) A^{-H}.

    Args:
      A: an array (..., n, n), real or complex.

    Returns:
      (sign, logabsdet), each (...): sign has A's dtype (+-1 or 0 for real A), logabsdet
      is real.

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg import slogdet
    >>> [round(float(v), 6) for v in slogdet(jnp.array([[0.0, 2.0], [3.0, 0.0]]))]
    [-1.0, 1.791759]

    See also: `logdet`, `det`.
    """
    _, sign, logabs = _lu_slogdet(A)
    return sign, logabs


@slogdet.frule
def slogdet_frule(tangents, A):
    _, A_dot = tangents
    factors, sign, logabs = _lu_slogdet(A)

    def slogdet_pushforward(A_dot):  # b = tr(A^{-1} A_dot): (i Im(b) sign, Re b); real signs are constant
        b = _trace_solve(factors, A_dot)
        sign_dot = 1j * jnp.imag(b) * sign if jnp.iscomplexobj(A) else ZeroTangent()
        return sign_dot, jnp.real(b)

    return (sign, logabs), _pushed(slogdet_pushforward, A_dot)


@slogdet.rrule
def slogdet_rrule(A):
    project_A = ProjectTo(A)
    factors, sign, logabs = _lu_slogdet(A)

    def slogdet_pullback(y_bar):
        sign_bar, logabs_bar = unthunk(y_bar)
        coef = jnp.zeros(A.shape[:-2], A.dtype)
        if not _is_zero(logabs_bar):
            coef = coef + logabs_bar
        if not _is_zero(sign_bar) and jnp.iscomplexobj(A):
            coef = coef - 1j * jnp.imag(jnp.conj(sign_bar) * sign)
        return NoTangent(), project_A(coef[..., None, None] * _inv_H(factors, A))

    return (sign, logabs), slogdet_pullback


@primitive(examples=[(_SPD3,)])
def logdet(A: jax.Array) -> jax.Array:
    """log det A of square matrices (real A: det > 0, else NaN; complex: principal log).

    Why a rule: the cotangent A^{-H} y_bar comes from the forward pass's LU factors
    (one solve), instead of JAX differentiating through the factorisation.

    Args:
      A: an array (..., n, n), e.g. symmetric positive definite.

    Returns:
      log det A (real for real A, complex for complex A).

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.linalg import logdet
    >>> jax.grad(logdet)(jnp.array([[2.0, 0.0], [0.0, 4.0]])).round(6).tolist()
    [[0.5, 0.0], [0.0, 0.25]]

    See also: `slogdet`, `det`, `rules.library.linalg_solve.cholesky`.
    """
    _, sign, logabs = _lu_slogdet(A)
    return logabs + jnp.log(sign)


@logdet.frule
def logdet_frule(tangents, A):
    _, A_dot = tangents
    factors, sign, logabs = _lu_slogdet(A)

    def logdet_pushforward(A_dot):
        return _trace_solve(factors, A_dot)

    return logabs + jnp.log(sign), _pushed(logdet_pushforward, A_dot)


@logdet.rrule
def logdet_rrule(A):
    project_A = ProjectTo(A)
    factors, sign, logabs = _lu_slogdet(A)

    def logdet_pullback(y_bar):
        return NoTangent(), project_A(jnp.asarray(unthunk(y_bar))[..., None, None] * _inv_H(factors, A))

    return logabs + jnp.log(sign), logdet_pullback


# ----- inv ----------------------------------------------------------------------------------
@primitive(examples=[(_M3.astype(np.float32),), (_M3Z,)])
def inv(A: jax.Array) -> jax.Array:
    """The inverse of the square matrix (or matrices) A.

    Why a rule: the pullback is two matrix products with the output,
    A_bar = -Y^H Y_bar Y^H, with no second factorisation.

    Args:
      A: an array (..., n, n), invertible.

    Returns:
      A^{-1}.

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg import inv
    >>> inv(jnp.array([[2.0, 0.0], [0.0, 4.0]])).tolist()
    [[0.5, 0.0], [0.0, 0.25]]

    See also: `rules.library.linalg_solve.solve`, `pinv`.
    """
    return jnp.linalg.inv(A)


@inv.frule
def inv_frule(tangents, A):
    _, A_dot = tangents
    y = jnp.linalg.inv(A)

    def inv_pushforward(A_dot):
        return -y @ A_dot @ y

    return y, _pushed(inv_pushforward, A_dot)


@inv.rrule
def inv_rrule(A):
    project_A = ProjectTo(A)
    y = jnp.linalg.inv(A)

    def inv_pullback(y_bar):
        yh = _H(y)
        return NoTangent(), project_A(-yh @ unthunk(y_bar) @ yh)

    return y, inv_pullback


# ----- pinv ---------------------------------------------------------------------------------
@primitive(examples=[(_M43,), (_M3Z,)])
def pinv(A: jax.Array) -> jax.Array:
    """The Moore-Penrose pseudo-inverse of a matrix of locally constant rank.

    Why a rule: the pullback is closed form in A and A^+ (matrix products only, no
    differentiation through the SVD): A_bar = -P^H Y_bar P^H + (I - A P) Y_bar^H P P^H
    + P^H P Y_bar^H (I - P A), with P = A^+ (Golub and Pereyra).

    Args:
      A: an array (..., m, n).

    Returns:
      A^+, (n, m).

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg import pinv
    >>> pinv(jnp.array([[2.0], [0.0]])).tolist()
    [[0.5, 0.0]]

    See also: `rules.library.linalg_solve.lstsq`, `inv`.
    """
    return jnp.linalg.pinv(A)


@pinv.frule
def pinv_frule(tangents, A):
    _, A_dot = tangents
    P = jnp.linalg.pinv(A)

    def pinv_pushforward(A_dot):
        DH, PH = _H(A_dot), _H(P)
        left = DH - P @ (A @ DH)  # (I - P A) A_dot^H
        right = DH - (DH @ A) @ P  # A_dot^H (I - A P)
        return -P @ A_dot @ P + left @ (PH @ P) + (P @ PH) @ right

    return P, _pushed(pinv_pushforward, A_dot)


@pinv.rrule
def pinv_rrule(A):
    project_A = ProjectTo(A)
    P = jnp.linalg.pinv(A)

    def pinv_pullback(y_bar):
        y_bar = unthunk(y_bar)
        PH, YH = _H(P), _H(y_bar)
        left = YH - (A @ P) @ YH  # (I - A P) Y_bar^H
        right = YH - YH @ (P @ A)  # Y_bar^H (I - P A)
        return NoTangent(), project_A(-PH @ y_bar @ PH + left @ (P @ PH) + (PH @ P) @ right)

    return P, pinv_pullback
