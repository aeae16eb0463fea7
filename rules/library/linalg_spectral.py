"""Spectral linear algebra primitives: eigh, svd, and functions of Hermitian matrices.

Conventions:

* Hermitian-input functions (`eigh`, `eigvalsh`, `sym_matrix_function` and the matrix
  functions built on it) read only the Hermitian part of their input: they compute
  A -> (A + A^H) / 2 first. Their cotangents are therefore Hermitian, and they agree with
  finite differences taken over every entry of A.
* Degenerate spectra. A pullback through eigenvectors has terms 1/(w_j - w_i) (eigh) or
  1/(s_j^2 - s_i^2) (svd), infinite on repeated values, where JAX returns NaN even for
  losses that do not depend on the choice of eigenvectors. Here a pair counts as
  degenerate when |w_i - w_j| <= sqrt(eps) * max|w| (eps of the dtype) and its term is
  dropped (0 instead of 1/0); singular values s <= sqrt(eps) * max(s) are treated as 0 in
  the 1/s terms of a non-square svd. The result is finite; it is exact for losses of the
  eigen/singular values alone and for losses whose V^H V_bar (U^H U_bar, V^H V_bar) has no
  off-diagonal entries inside a degenerate eigenspace, e.g. trace(V diag(g(w)) V^H). A
  smooth function of the matrix, V diag(f(w)) V^H, has a nonzero limit there (f'(w));
  `sym_matrix_function` computes it (Daleckii-Krein), so use it for matrix functions.
* Phase convention. Eigenvectors and singular vector pairs are only determined up to a
  sign (a phase), and backends (LAPACK, cuSOLVER's Jacobi, batched or not) choose it
  differently. `eigh` and `svd` fix it: each eigenvector v_i, and each pair (u_i, v_i)
  through v_i, is turned so that its pivot entry is real and positive, the pivot being the
  first entry within a relative sqrt(eps) of the largest magnitude (so exact ties, as in
  (1, -1) / sqrt(2), resolve alike whatever the rounding). The outputs are then functions
  of A, smooth where the pivot is unambiguous and the values are distinct (and nonzero:
  svd), and the rules return their derivative: the usual gauge-free formula plus, for
  complex arguments, the convention's phase term (`_with_phase_term`).
* Complex arguments use ChainRules' convention (x_bar = dl/dRe x + i dl/dIm x).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._primitive import primitive
from .._projection import ProjectTo
from .._thunks import unthunk
from .._zeros import NoTangent
from .linalg import _H, _herm, _is_zero, _nots

__all__ = ["eigh", "eigvalsh", "svd", "svdvals", "sym_matrix_function", "sqrtm_psd", "expm_sym", "logm_spd"]

# ----- example inputs: distinct, well separated eigenvalues / singular values ---------------
_Q3 = np.linalg.qr(np.array([[1.0, 0.4, -0.3], [0.2, -1.1, 0.5], [0.6, 0.3, 0.9]]))[0]
_S3 = _Q3 @ np.diag([0.5, 1.5, 3.0]) @ _Q3.T  # symmetric positive definite
_S3Z = np.array([[2.0, 0.5 - 0.3j, 0.1j], [0.5 + 0.3j, 1.0, -0.2], [-0.1j, -0.2, 3.0]])
_M43 = np.array([[1.0, 0.2, -0.5], [0.3, 2.0, 0.1], [-0.4, 0.6, 1.5], [0.2, -0.1, 0.3]])
_M3Z = np.array([[2.0 + 0.3j, 0.5, -0.3], [0.1, 1.5 - 0.2j, 0.4j], [-0.2, 0.3 + 0.1j, 1.0]])


# ----- helpers ------------------------------------------------------------------------------
def _degenerate(w: jax.Array) -> jax.Array:
    """Pairs (i, j) with |w_i - w_j| <= sqrt(eps) * max|w|; the diagonal included."""
    tol = np.sqrt(np.finfo(w.dtype).eps) * jnp.max(jnp.abs(w), axis=-1, keepdims=True)[..., None]
    return jnp.abs(w[..., :, None] - w[..., None, :]) <= tol


def _inverse_gaps(w: jax.Array, v: jax.Array) -> jax.Array:
    """F_ij = 1 / (v_j - v_i), and 0 on the diagonal and on degenerate pairs of w."""
    skip = _degenerate(w)
    return jnp.where(skip, 0, 1 / jnp.where(skip, 1, v[..., None, :] - v[..., :, None]))


def _diag(d: jax.Array) -> jax.Array:
    """Diagonal matrices from vectors along the last axis."""
    return d[..., :, None] * jnp.eye(d.shape[-1], dtype=d.dtype)[(None,) * (d.ndim - 1)]


def _sandwich(V: jax.Array, inner: jax.Array, W: jax.Array | None = None) -> jax.Array:
    """V inner W^H (W defaults to V)."""
    return V @ inner.astype(V.dtype) @ _H(V if W is None else W)


# ----- the phase convention (module docstring) -------------------------------------------------
def _fix_phases(v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(v d, d, k): the columns of v times unit factors d (1, n) that make entry k_i of column i,
    its pivot, real and positive; the pivot is the first entry within a relative sqrt(eps) of
    the column's largest magnitude."""
    mag = jnp.abs(v)
    near_top = mag >= (1 - np.sqrt(np.finfo(mag.dtype).eps)) * jnp.max(mag, axis=-2, keepdims=True)
    k = jnp.argmax(near_top, axis=-2)
    pivot = jnp.take_along_axis(v, k[..., None, :], axis=-2)
    zero = pivot == 0
    d = jnp.where(zero, 1, jnp.conj(pivot) / jnp.where(zero, 1, jnp.abs(pivot)))
    return v * d, d, k


def _with_phase_term(v: jax.Array, k: jax.Array, v_bar, *pairs) -> jax.Array:
    """v_bar plus the cotangent the phase convention adds, for complex v (else v_bar).

    A tangent that turns vector pair i by a phase i theta_i changes the loss by theta_i g_i,
    g_i = Im(x_i^H x_bar_i) summed over the pair's vectors x (v and those in `pairs`, given as
    (x, x_bar)). The convention (pivot v[k_i, i] stays real) turns the gauge-free tangent dV0
    by theta_i = -Im(dV0[k_i, i]) / v[k_i, i]: the cotangent W[k_i, i] = -i g_i / v[k_i, i].
    """
    if not jnp.iscomplexobj(v):
        return v_bar
    terms = [(x, x_bar) for x, x_bar in ((v, v_bar), *pairs) if not _is_zero(x_bar)]
    if not terms:
        return v_bar
    g = sum(jnp.imag(jnp.sum(jnp.conj(x) * x_bar, axis=-2, keepdims=True)) for x, x_bar in terms)
    pivot = jnp.real(jnp.take_along_axis(v, k[..., None, :], axis=-2))
    W = jax.nn.one_hot(k, v.shape[-2], dtype=v.dtype, axis=-2) * (-1j * g / pivot)
    return W if _is_zero(v_bar) else v_bar + W


# ----- eigh ---------------------------------------------------------------------------------
@primitive(examples=[(_S3,), (_S3.astype(np.float32),), (_S3Z,)])
def eigh(A: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Eigenvalues (ascending) and eigenvectors of the Hermitian part of A.

    Why a rule: the eigenvectors' phases follow one convention on every backend and the
    rule is the derivative of that function (module docstring). JAX's eigh pullback
    divides by eigenvalue gaps and is NaN at repeated eigenvalues (and inaccurate at
    nearly repeated ones) even for losses that ignore the choice of eigenvectors (e.g.
    trace(V diag(g(w)) V^H)); here degenerate pairs are dropped (module docstring), the
    1/(w_j - w_i) terms are skipped entirely when the eigenvectors get no cotangent, and
    the cotangent is Hermitian (the function reads (A + A^H) / 2). For smooth matrix
    functions use `sym_matrix_function` instead.

    Args:
      A: an array (..., n, n); only its Hermitian part is used.

    Returns:
      (w, v): real eigenvalues (..., n) in ascending order, eigenvectors in the columns of
      v (..., n, n), each with its pivot entry (the first of largest magnitude, to a
      relative sqrt(eps)) real and positive, whatever the backend (module docstring).

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg_spectral import eigh
    >>> w, v = eigh(jnp.array([[2.0, 1.0], [1.0, 2.0]]))
    >>> w.round(6).tolist(), v.round(6).tolist()
    ([1.0, 3.0], [[0.707107, 0.707107], [-0.707107, 0.707107]])

    See also: `eigvalsh`, `sym_matrix_function`, `svd`.
    """
    w, v, _ = _eigh(A)
    return w, v


def _eigh(A: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(w, v, pivots): eigh of A's Hermitian part, v in the phase convention."""
    w, v = jnp.linalg.eigh(_herm(A), symmetrize_input=False)
    v, _, k = _fix_phases(v)
    return w, v, k


@eigh.rrule
def eigh_rrule(A):
    project_A = ProjectTo(A)
    w, v, k = _eigh(A)

    def eigh_pullback(y_bar):
        w_bar, v_bar = unthunk(y_bar)
        v_bar = _with_phase_term(v, k, v_bar)
        inner = jnp.zeros(v.shape, v.dtype)
        if not _is_zero(w_bar):
            inner = inner + _diag(w_bar)
        if not _is_zero(v_bar):
            inner = inner + _inverse_gaps(w, w) * (_H(v) @ v_bar)
        return NoTangent(), project_A(_herm(_sandwich(v, inner)))

    return (w, v), eigh_pullback


# ----- eigvalsh -----------------------------------------------------------------------------
@primitive(examples=[(_S3,), (_S3Z,)])
def eigvalsh(A: jax.Array) -> jax.Array:
    """Eigenvalues (ascending) of the Hermitian part of A.

    Why a rule: the pullback V diag(w_bar) V^H has no eigenvalue gaps at all, so it is
    finite at repeated eigenvalues, and it is Hermitian (the function reads (A + A^H) / 2).

    Args:
      A: an array (..., n, n); only its Hermitian part is used.

    Returns:
      w, real, (..., n), ascending.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.linalg_spectral import eigvalsh
    >>> jax.grad(lambda A: eigvalsh(A)[-1])(jnp.diag(jnp.array([1.0, 2.0]))).tolist()
    [[0.0, 0.0], [0.0, 1.0]]

    See also: `eigh`, `svdvals`.
    """
    return jnp.linalg.eigvalsh(_herm(A), symmetrize_input=False)


@eigvalsh.rrule
def eigvalsh_rrule(A):
    project_A = ProjectTo(A)
    w, v = jnp.linalg.eigh(_herm(A), symmetrize_input=False)

    def eigvalsh_pullback(w_bar):
        return NoTangent(), project_A(_sandwich(v, _diag(jnp.real(unthunk(w_bar)))))

    return w, eigvalsh_pullback


# ----- svd ----------------------------------------------------------------------------------
def _svd_cotangent(u, s, v, u_bar, s_bar, v_bar):
    """A_bar for A = U diag(s) V^H (thin) from the cotangents of U, s, V (any may be zero)."""
    inner = jnp.zeros(s.shape + s.shape[-1:], u.dtype)
    out = jnp.zeros(u.shape[:-1] + v.shape[-2:-1], u.dtype)
    tiny = s <= np.sqrt(np.finfo(s.dtype).eps) * jnp.max(s, axis=-1, keepdims=True)
    s_inv = jnp.where(tiny, 0, 1 / jnp.where(tiny, 1, s))
    F = _inverse_gaps(s, s * s)
    if not _is_zero(s_bar):
        inner = inner + _diag(jnp.real(s_bar))
    if not _is_zero(u_bar):
        J = _H(u) @ u_bar
        FJ = F * J
        inner = inner + (FJ + _H(FJ)) * s[..., None, :]
        if jnp.iscomplexobj(J):  # the phase of u_i: i Im(J_ii) / s_i
            inner = inner + _diag(1j * jnp.imag(jnp.diagonal(J, axis1=-2, axis2=-1)) * s_inv)
        out = out + ((u_bar - u @ J) * s_inv[..., None, :]) @ _H(v)
    if not _is_zero(v_bar):
        K = _H(v) @ v_bar
        FK = F * K
        inner = inner + s[..., :, None] * (FK + _H(FK))
        out = out + (u * s_inv[..., None, :]) @ _H(v_bar - v @ K)
    return _sandwich(u, inner, v) + out


@primitive(examples=[(_M43,), (_M43.T.astype(np.float32),), (_M3Z[:2],)])
def svd(A: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The thin singular value decomposition A = u diag(s) vt (full_matrices=False).

    Why a rule: the singular vectors' phases follow one convention on every backend and
    the rule is the derivative of that function, also for complex A and losses that see
    the phases (module docstring). JAX's svd pullback divides by s_j^2 - s_i^2 and is NaN
    at repeated singular values; here degenerate pairs and (near-)zero singular values in
    the 1/s terms are dropped (module docstring), so the cotangent is finite, and exact
    for the losses described there (functions of s alone, or e.g. trace(u diag(g(s)) u^H)).

    Args:
      A: an array (..., m, n), real or complex.

    Returns:
      (u, s, vt): u (..., m, k), s (..., k) descending, vt (..., k, n), k = min(m, n);
      each pair (u_i, v_i = vt_i^H) turned so that v_i's pivot entry (the first of largest
      magnitude, to a relative sqrt(eps)) is real and positive, whatever the backend
      (module docstring).

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg_spectral import svd
    >>> u, s, vt = svd(jnp.array([[3.0, 0.0], [0.0, -2.0]]))
    >>> s.round(6).tolist(), u.round(6).tolist(), vt.round(6).tolist()
    ([3.0, 2.0], [[1.0, 0.0], [0.0, -1.0]], [[1.0, 0.0], [0.0, 1.0]])

    See also: `svdvals`, `eigh`, `rules.library.linalg.pinv`.
    """
    u, s, vt, _ = _svd(A)
    return u, s, vt


def _svd(A: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(u, s, vt, pivots): the thin svd of A in the phase convention (set by v = vt^H)."""
    u, s, vt = jnp.linalg.svd(A, full_matrices=False)
    v, d, k = _fix_phases(_H(vt))
    return u * d, s, _H(v), k


@svd.rrule
def svd_rrule(A):
    project_A = ProjectTo(A)
    u, s, vt, k = _svd(A)
    v = _H(vt)

    def svd_pullback(y_bar):
        u_bar, s_bar, vt_bar = unthunk(y_bar)
        v_bar = _with_phase_term(v, k, vt_bar if _is_zero(vt_bar) else _H(vt_bar), (u, u_bar))
        return NoTangent(), project_A(_svd_cotangent(u, s, v, u_bar, s_bar, v_bar))

    return (u, s, vt), svd_pullback


# ----- svdvals ------------------------------------------------------------------------------
@primitive(examples=[(_M43,), (_M3Z,)])
def svdvals(A: jax.Array) -> jax.Array:
    """The singular values of A, descending.

    Why a rule: the pullback u diag(s_bar) v^H uses no singular value gaps, so it is
    finite at repeated singular values, and costs one product with the factors the
    forward pass computed.

    Args:
      A: an array (..., m, n), real or complex.

    Returns:
      s, real, (..., min(m, n)), descending.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.linalg_spectral import svdvals
    >>> jax.grad(lambda A: svdvals(A).sum())(jnp.array([[3.0, 0.0], [0.0, -2.0]])).tolist()
    [[1.0, 0.0], [0.0, -1.0]]

    See also: `svd`, `eigvalsh`, `rules.library.linalg.norm` (ord="nuc").
    """
    return jnp.linalg.svd(A, compute_uv=False)


@svdvals.rrule
def svdvals_rrule(A):
    project_A = ProjectTo(A)
    u, s, vt = jnp.linalg.svd(A, full_matrices=False)

    def svdvals_pullback(s_bar):
        return NoTangent(), project_A(_sandwich(u, _diag(jnp.real(unthunk(s_bar))), _H(vt)))

    return s, svdvals_pullback


# ----- functions of Hermitian matrices (Daleckii-Krein) --------------------------------------
def _divided_differences(w: jax.Array, fw: jax.Array, dfw: jax.Array) -> jax.Array:
    """K_ij = (f(w_i) - f(w_j)) / (w_i - w_j), and (f'(w_i) + f'(w_j)) / 2 on near-equal pairs.

    Near-equal: where the divided difference would lose more than eps^(2/3) of its value to
    cancellation, eps (|f(w_i)| + |f(w_j)|) > eps^(2/3) |w_i - w_j| |K_ij| (the mean of the
    derivatives is then off by O((w_i - w_j)^2 f''') only), or where the eigenvalues differ
    by at most n eps max|w| (eigh cannot tell them apart).
    """
    eps = np.finfo(w.dtype).eps
    gap = w[..., :, None] - w[..., None, :]
    slope = (fw[..., :, None] - fw[..., None, :]) / jnp.where(gap == 0, 1, gap)
    mean = (dfw[..., :, None] + dfw[..., None, :]) / 2
    lost = eps * (jnp.abs(fw)[..., :, None] + jnp.abs(fw)[..., None, :])
    kept = eps ** (2 / 3) * jnp.abs(gap) * jnp.maximum(jnp.abs(mean), jnp.abs(slope))
    noise = w.shape[-1] * eps * jnp.max(jnp.abs(w), axis=-1, keepdims=True)[..., None]
    near = (jnp.abs(gap) <= noise) | (lost > kept)
    return jnp.where(near, mean, slope)


def _apply(A: jax.Array, f: Callable) -> jax.Array:
    w, v = jnp.linalg.eigh(_herm(A), symmetrize_input=False)
    return _sandwich(v, _diag(f(w)))


def _eigen_function(A: jax.Array, f: Callable, df: Callable | None):
    """(f(A), pullback core) for Hermitian A = V diag(w) V^H: f(A) = V diag(f(w)) V^H."""
    w, v = jnp.linalg.eigh(_herm(A), symmetrize_input=False)
    fw = f(w)
    dfw = jax.jvp(f, (w,), (jnp.ones_like(w),))[1] if df is None else df(w)
    y = _sandwich(v, _diag(fw))

    def core(y_bar):
        K = _divided_differences(w, fw, dfw)
        return _sandwich(v, K * (_H(v) @ _herm(unthunk(y_bar)) @ v))

    return y, core


@primitive(examples=[(_S3, jnp.sin), (_S3.astype(np.float32), jnp.tanh, lambda w: 1 - jnp.tanh(w) ** 2),
                     (_S3Z, jnp.exp)])
def sym_matrix_function(A: jax.Array, f: Callable, df: Callable | None = None) -> jax.Array:
    """f(A) = V diag(f(w)) V^H for the Hermitian part of A = V diag(w) V^H.

    Why a rule: the derivative of a matrix function is the Daleckii-Krein formula
    A_bar = V (K o (V^H herm(Y_bar) V)) V^H, with K the divided differences of f on the
    eigenvalues and f'(w) on (near-)equal pairs (tolerance in `_divided_differences`).
    Differentiating through eigh instead is NaN at repeated eigenvalues (e.g. at the
    identity), and loses digits near them.

    Args:
      A: an array (..., n, n); only its Hermitian part is used.
      f: a static elementwise function, real on the eigenvalues (e.g. `jnp.exp`); it is
        hashed into the compilation cache, so reuse one function object across calls.
      df: its derivative, elementwise; by default `jax.jvp` of f (give df when f has no
        forward mode, e.g. a primitive with an rrule).

    Returns:
      f(A), Hermitian, of A's shape.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.linalg_spectral import sym_matrix_function
    >>> jax.grad(lambda A: sym_matrix_function(A, jnp.exp).sum())(jnp.eye(2)).round(6).tolist()
    [[2.718282, 2.718282], [2.718282, 2.718282]]

    See also: `sqrtm_psd`, `expm_sym`, `logm_spd`, `eigh`.
    """
    return _apply(A, f)


@sym_matrix_function.rrule
def sym_matrix_function_rrule(A, f, *options, df=None):
    (df,) = options or (df,)
    project_A = ProjectTo(A)
    y, core = _eigen_function(A, f, df)

    def sym_matrix_function_pullback(y_bar):
        return (NoTangent(), project_A(core(y_bar)), NoTangent()) + _nots(len(options))

    return y, sym_matrix_function_pullback


def _sqrt(w):
    return jnp.sqrt(jnp.maximum(w, 0))


def _dsqrt(w):
    return 0.5 / jnp.sqrt(jnp.maximum(w, 0))


def _dlog(w):
    return 1 / w


# ----- sqrtm_psd ----------------------------------------------------------------------------
@primitive(examples=[(_S3,), (_S3Z,)])
def sqrtm_psd(A: jax.Array) -> jax.Array:
    """The positive semidefinite square root of the Hermitian PSD part of A.

    Why a rule: `sym_matrix_function(A, sqrt)`: Daleckii-Krein divided differences, finite
    at repeated eigenvalues (e.g. the identity), where eigh-based code is NaN under JAX.
    Eigenvalues rounded below 0 are clipped to 0.

    Args:
      A: an array (..., n, n), Hermitian positive (semi)definite.

    Returns:
      S with S S = A, S Hermitian PSD.

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg_spectral import sqrtm_psd
    >>> sqrtm_psd(jnp.array([[4.0, 0.0], [0.0, 9.0]])).round(6).tolist()
    [[2.0, 0.0], [0.0, 3.0]]

    See also: `sym_matrix_function`, `rules.library.linalg_solve.cholesky`.
    """
    return _apply(A, _sqrt)


@sqrtm_psd.rrule
def sqrtm_psd_rrule(A):
    project_A = ProjectTo(A)
    y, core = _eigen_function(A, _sqrt, _dsqrt)

    def sqrtm_psd_pullback(y_bar):
        return NoTangent(), project_A(core(y_bar))

    return y, sqrtm_psd_pullback


# ----- expm_sym -----------------------------------------------------------------------------
@primitive(examples=[(_S3,), (_S3.astype(np.float32),)])
def expm_sym(A: jax.Array) -> jax.Array:
    """The matrix exponential of the Hermitian part of A, by its eigendecomposition.

    Why a rule: `sym_matrix_function(A, exp)`: one eigh and a Daleckii-Krein pullback,
    finite at repeated eigenvalues where eigh-based code is NaN under JAX, and agreeing
    with `jax.scipy.linalg.expm` (Pade) on Hermitian matrices.

    Args:
      A: an array (..., n, n); only its Hermitian part is used.

    Returns:
      exp(A), Hermitian positive definite.

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg_spectral import expm_sym
    >>> expm_sym(jnp.zeros((2, 2))).tolist()
    [[1.0, 0.0], [0.0, 1.0]]

    See also: `sym_matrix_function`, `logm_spd`, `jax.scipy.linalg.expm`.
    """
    return _apply(A, jnp.exp)


@expm_sym.rrule
def expm_sym_rrule(A):
    project_A = ProjectTo(A)
    y, core = _eigen_function(A, jnp.exp, jnp.exp)

    def expm_sym_pullback(y_bar):
        return NoTangent(), project_A(core(y_bar))

    return y, expm_sym_pullback


# ----- logm_spd -----------------------------------------------------------------------------
@primitive(examples=[(_S3,), (_S3Z,)])
def logm_spd(A: jax.Array) -> jax.Array:
    """The principal matrix logarithm of the Hermitian positive definite part of A.

    Why a rule: `sym_matrix_function(A, log)`: a Daleckii-Krein pullback, finite at
    repeated eigenvalues (e.g. the identity) where eigh-based code is NaN under JAX.

    Args:
      A: an array (..., n, n), Hermitian positive definite.

    Returns:
      log(A), Hermitian.

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg_spectral import logm_spd
    >>> logm_spd(jnp.eye(2)).tolist()
    [[0.0, 0.0], [0.0, 0.0]]

    See also: `sym_matrix_function`, `expm_sym`, `rules.library.linalg.logdet`.
    """
    return _apply(A, jnp.log)


@logm_spd.rrule
def logm_spd_rrule(A):
    project_A = ProjectTo(A)
    y, core = _eigen_function(A, jnp.log, _dlog)

    def logm_spd_pullback(y_bar):
        return NoTangent(), project_A(core(y_bar))

    return y, logm_spd_pullback

