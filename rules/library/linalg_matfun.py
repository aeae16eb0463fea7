"""Matrix functions: sym_matrix_function, sqrtm_psd, expm_sym, logm_spd; svd_matrix_function.

f(A) = V diag(f(w)) V^H for the Hermitian part of A = V diag(w) V^H. The derivative is the
Daleckii-Krein formula, L(X) = V (K o (V^H herm(X) V)) V^H with K the divided differences
of f on the eigenvalues (f' on near-equal pairs): finite at repeated eigenvalues, where
differentiating through eigh is NaN. L is self-adjoint, so one map serves as the frule's
pushforward (X = A_dot) and the rrule's pullback (X = Y_bar). Each function reads only the
Hermitian part of A (its cotangent is Hermitian, its tangent depends only on herm(A_dot)).
Complex arguments use ChainRules' convention (x_bar = dl/dRe x + i dl/dIm x). The names are
also importable from `rules.library.linalg_spectral`, where they used to live.
`svd_matrix_function` is the singular values' counterpart, U diag(f(s)) V^T of a real
matrix, with the same kind of divided differences: determined at repeated and zero
singular values, where the loss through `svd` is not.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._primitive import primitive
from .._projection import ProjectTo
from .._thunks import unthunk
from .._zeros import NoTangent
from .linalg import _H, _M3, _M43, _S3, _S3Z, _diag, _herm, _mT, _nots, _pushed, _sandwich

__all__ = ["sym_matrix_function", "svd_matrix_function", "sqrtm_psd", "expm_sym", "logm_spd"]


# ----- helpers: the Daleckii-Krein derivative ------------------------------------------------
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
    """(f(A), L) for Hermitian A = V diag(w) V^H: f(A) = V diag(f(w)) V^H and its derivative
    L(X) = V (K o (V^H herm(X) V)) V^H, self-adjoint: the pushforward and the pullback."""
    w, v = jnp.linalg.eigh(_herm(A), symmetrize_input=False)
    fw = f(w)
    dfw = jax.jvp(f, (w,), (jnp.ones_like(w),))[1] if df is None else df(w)
    y = _sandwich(v, _diag(fw))

    def daleckii_krein(X):
        K = _divided_differences(w, fw, dfw)
        return _sandwich(v, K * (_H(v) @ _herm(unthunk(X)) @ v))

    return y, daleckii_krein


def _spectral_rules(prim: Any, f: Callable, df: Callable) -> None:
    """Give the primitive `A -> f(A)` (one argument) its frule and rrule: the Daleckii-Krein
    map of `_eigen_function`, which is its own adjoint, pushes A_dot forward and pulls Y_bar back."""
    name = prim.__name__

    def frule(tangents, A):
        _, A_dot = tangents
        y, frechet = _eigen_function(A, f, df)
        return y, _pushed(frechet, A_dot)

    def rrule(A):
        project_A = ProjectTo(A)
        y, frechet = _eigen_function(A, f, df)

        def pullback(y_bar):
            return NoTangent(), project_A(frechet(y_bar))

        pullback.__name__ = pullback.__qualname__ = f"{name}_pullback"
        return y, pullback

    frule.__name__ = frule.__qualname__ = f"{name}_frule"
    rrule.__name__ = rrule.__qualname__ = f"{name}_rrule"
    prim.frule(frule)
    prim.rrule(rrule)


# ----- sym_matrix_function ------------------------------------------------------------------
@primitive(examples=[(_S3, jnp.sin), (_S3.astype(np.float32), jnp.tanh, lambda w: 1 - jnp.tanh(w) ** 2),
                     (_S3Z, jnp.exp)])
def sym_matrix_function(A: jax.Array, f: Callable, df: Callable | None = None) -> jax.Array:
    """f(A) = V diag(f(w)) V^H for the Hermitian part of A = V diag(w) V^H.

    Why a rule: the derivative of a matrix function is the Daleckii-Krein formula
    A_bar = V (K o (V^H herm(Y_bar) V)) V^H (Y_dot: the same map of A_dot), with K the
    divided differences of f on the eigenvalues and f'(w) on (near-)equal pairs
    (tolerance in `_divided_differences`).
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
    >>> from rules.library.linalg_matfun import sym_matrix_function
    >>> jax.grad(lambda A: sym_matrix_function(A, jnp.exp).sum())(jnp.eye(2)).round(6).tolist()
    [[2.718282, 2.718282], [2.718282, 2.718282]]

    See also: `sqrtm_psd`, `expm_sym`, `logm_spd`, `rules.library.linalg_spectral.eigh`.
    """
    return _apply(A, f)


@sym_matrix_function.frule
def sym_matrix_function_frule(tangents, A, f, *options, df=None):
    _, A_dot, *_ = tangents
    (df,) = options or (df,)
    y, frechet = _eigen_function(A, f, df)
    return y, _pushed(frechet, A_dot)


@sym_matrix_function.rrule
def sym_matrix_function_rrule(A, f, *options, df=None):
    (df,) = options or (df,)
    project_A = ProjectTo(A)
    y, frechet = _eigen_function(A, f, df)

    def sym_matrix_function_pullback(y_bar):
        return (NoTangent(), project_A(frechet(y_bar)), NoTangent()) + _nots(len(options))

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
    >>> from rules.library.linalg_matfun import sqrtm_psd
    >>> sqrtm_psd(jnp.array([[4.0, 0.0], [0.0, 9.0]])).round(6).tolist()
    [[2.0, 0.0], [0.0, 3.0]]

    See also: `sym_matrix_function`, `rules.library.linalg_solve.cholesky`.
    """
    return _apply(A, _sqrt)


_spectral_rules(sqrtm_psd, _sqrt, _dsqrt)


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
    >>> from rules.library.linalg_matfun import expm_sym
    >>> expm_sym(jnp.zeros((2, 2))).tolist()
    [[1.0, 0.0], [0.0, 1.0]]

    See also: `sym_matrix_function`, `logm_spd`, `jax.scipy.linalg.expm`.
    """
    return _apply(A, jnp.exp)


_spectral_rules(expm_sym, jnp.exp, jnp.exp)


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
    >>> from rules.library.linalg_matfun import logm_spd
    >>> logm_spd(jnp.eye(2)).tolist()
    [[0.0, 0.0], [0.0, 0.0]]

    See also: `sym_matrix_function`, `expm_sym`, `rules.library.linalg.logdet`.
    """
    return _apply(A, jnp.log)


_spectral_rules(logm_spd, jnp.log, _dlog)


# ----- svd_matrix_function: the singular values' side ---------------------------------------------
def _svd_function(A: jax.Array, f: Callable, df: Callable | None):
    """(g(A), pushforward, pullback) for g(A) = U diag(f(s)) V^T, A = U diag(s) V^T (thin SVD).

    With P = U^T A_dot V: g_dot = U (D1 o sym(P) + D2 o skew(P)) V^T, D1 the divided
    differences of f on the singular values (f' on ties), D2_ij = (f(s_i) + f(s_j)) / (s_i + s_j)
    (f' where both are 0), plus (I - U U^T) A_dot V diag(f(s) / s) V^T for a tall A. The
    pullback is its transpose: U (sym(D1 o Q) + skew(D2 o Q)) V^T (+ the tall term), Q = U^T G V.
    """
    if jnp.iscomplexobj(A):
        raise TypeError(
            "`svd_matrix_function`: complex matrices are not supported; expected a real array "
            f"(got {jnp.result_type(A)}); for a Hermitian matrix use `sym_matrix_function`."
        )
    wide = A.shape[-2] < A.shape[-1]
    B = _mT(A) if wide else A
    u, s, vt = jnp.linalg.svd(B, full_matrices=False)
    v = _mT(vt)
    fs = f(s)
    dfs = jax.jvp(f, (s,), (jnp.ones_like(s),))[1] if df is None else df(s)
    D1 = _divided_differences(s, fs, dfs)
    total = s[..., :, None] + s[..., None, :]
    zero = total == 0
    D2 = jnp.where(zero, (dfs[..., :, None] + dfs[..., None, :]) / 2,
                   (fs[..., :, None] + fs[..., None, :]) / jnp.where(zero, 1, total))
    h = jnp.where(s == 0, dfs, fs / jnp.where(s == 0, 1, s))
    tall = B.shape[-2] > B.shape[-1]
    y = (u * fs[..., None, :]) @ vt

    def beyond(X):  # the tall term, self-adjoint: (I - U U^T) X V diag(h) V^T
        return (X - u @ (_mT(u) @ X)) @ ((v * h[..., None, :]) @ vt) if tall else 0

    def pushforward(A_dot):
        B_dot = _mT(A_dot) if wide else A_dot
        P = _mT(u) @ B_dot @ v
        out = u @ (D1 * (P + _mT(P)) / 2 + D2 * (P - _mT(P)) / 2) @ vt + beyond(B_dot)
        return _mT(out) if wide else out

    def pullback(G):
        G = _mT(G) if wide else G
        X, Y = D1 * (_mT(u) @ G @ v), D2 * (_mT(u) @ G @ v)
        out = u @ ((X + _mT(X)) / 2 + (Y - _mT(Y)) / 2) @ vt + beyond(G)
        return _mT(out) if wide else out

    return (_mT(y) if wide else y), pushforward, pullback


def _identity(s):
    return s


@primitive(examples=[(_M43, jnp.sin), (_M43.T, jnp.tanh), (_M3.astype(np.float32), _identity, jnp.ones_like),
                     (np.eye(3), jnp.sin)])
def svd_matrix_function(A: jax.Array, f: Callable, df: Callable | None = None) -> jax.Array:
    """U diag(f(s)) V^T for the SVD A = U diag(s) V^T of a real matrix: a function of the singular values.

    Why a rule: through `svd` (JAX's or `rules.library.linalg_spectral.svd`) the derivative
    divides by s_j^2 - s_i^2 and is NaN (JAX) or undetermined (the library: NaN) at repeated
    singular values, e.g. at every orthogonal matrix, though U f(S) V^T is smooth there. The
    rule is the singular values' Daleckii-Krein formula (see `_svd_function`): divided
    differences of f on the singular values on the symmetric part of U^T A_dot V, (f(s_i) +
    f(s_j)) / (s_i + s_j) on its skew part, and f(s) / s on the part beyond U for a tall A. At
    a rank-deficient A, g is well defined only for f(0) = 0 (then f'(0) takes the place of
    f(s) / s); `sum(svd_matrix_function(A, lambda s: s))` has the gradient of `sum(A)`: all ones.

    Args:
      A: a real array (..., m, n).
      f: a static elementwise function of the singular values (>= 0); hashed into the
        compilation cache, so reuse one function object across calls.
      df: its derivative, elementwise; by default `jax.jvp` of f.

    Returns:
      U diag(f(s)) V^T, of A's shape.

    Raises:
      TypeError: complex A.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.linalg_matfun import svd_matrix_function
    >>> jax.grad(lambda A: svd_matrix_function(A, jnp.tanh).sum())(jnp.eye(2)).round(6).tolist()
    [[0.419974, 0.419974], [0.419974, 0.419974]]

    See also: `sym_matrix_function`, `rules.library.linalg_spectral.svd`.
    """
    return _svd_function(A, f, df)[0]


@svd_matrix_function.frule
def svd_matrix_function_frule(tangents, A, f, *options, df=None):
    _, A_dot, *_ = tangents
    (df,) = options or (df,)
    y, pushforward, _ = _svd_function(A, f, df)
    return y, _pushed(pushforward, A_dot)


@svd_matrix_function.rrule
def svd_matrix_function_rrule(A, f, *options, df=None):
    (df,) = options or (df,)
    project_A = ProjectTo(A)
    y, _, pullback = _svd_function(A, f, df)

    def svd_matrix_function_pullback(y_bar):
        return (NoTangent(), project_A(pullback(unthunk(y_bar))), NoTangent()) + _nots(len(options))

    return y, svd_matrix_function_pullback
