"""Functions of Hermitian matrices: sym_matrix_function, sqrtm_psd, expm_sym, logm_spd.

f(A) = V diag(f(w)) V^H for the Hermitian part of A = V diag(w) V^H. The derivative is the
Daleckii-Krein formula, L(X) = V (K o (V^H herm(X) V)) V^H with K the divided differences
of f on the eigenvalues (f' on near-equal pairs): finite at repeated eigenvalues, where
differentiating through eigh is NaN. L is self-adjoint, so one map serves as the frule's
pushforward (X = A_dot) and the rrule's pullback (X = Y_bar). Each function reads only the
Hermitian part of A (its cotangent is Hermitian, its tangent depends only on herm(A_dot)).
Complex arguments use ChainRules' convention (x_bar = dl/dRe x + i dl/dIm x). The names are
also importable from `rules.library.linalg_spectral`, where they used to live.
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
from .linalg import _H, _S3, _S3Z, _diag, _herm, _nots, _pushed, _sandwich

__all__ = ["sym_matrix_function", "sqrtm_psd", "expm_sym", "logm_spd"]


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

