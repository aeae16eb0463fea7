"""Matrix functions: sym_matrix_function, sqrtm_psd, expm_sym, logm_spd; svd_matrix_function.

f(A) = V diag(f(w)) V^H for the Hermitian part of A = V diag(w) V^H. The derivative is the
Daleckii-Krein formula, L(X) = V (K o (V^H herm(X) V)) V^H with K the divided differences
of f on the eigenvalues (f' on near-equal pairs): finite at repeated eigenvalues, where
differentiating through eigh is NaN. L is self-adjoint, so one map serves as the frule's
pushforward (X = A_dot) and the rrule's pullback (X = Y_bar). Each function reads only the
Hermitian part of A (its cotangent is Hermitian, its tangent depends only on herm(A_dot)).
Second derivatives are the second-order formula, with the divided differences
f[w_i, w_k, w_j] (f''/2 on ties): finite and exact at repeated eigenvalues too (the Hessian
of expm_sym at 0); a third derivative raises NotImplementedError rather than go through eigh.
Complex arguments use ChainRules' convention (x_bar = dl/dRe x + i dl/dIm x). The names are
also importable from `rules.library.linalg_spectral`, where they used to live.
`svd_matrix_function` is the singular values' counterpart, U diag(f(s)) V^T of a real
matrix, with the same kind of divided differences: determined at repeated and zero
singular values, where the loss through `svd` is not.
"""

from __future__ import annotations

from functools import partial
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


def _second_divided_differences(w: jax.Array, K: jax.Array, d2fw: jax.Array, k: Any) -> jax.Array:
    """T_ij = f[w_i, w_k, w_j] for one k, from the first divided differences K.

    The divided difference is symmetric, so it is the difference of two K's over the widest
    of the three gaps; the mean of f''/2 at the three points where that loses more than
    eps^(1/4) of it to cancellation (the mean is off by O(gap^2) only) or where the points are
    within n eps max|w| (eigh cannot tell them apart). Exact at ties, ~eps^(1/2) near them.
    """
    eps = np.finfo(w.dtype).eps
    wi, wj = w[..., :, None], w[..., None, :]
    wk = jax.lax.dynamic_index_in_dim(w, k, axis=-1)[..., None]
    K_ik = jax.lax.dynamic_index_in_dim(K, k, axis=-1)
    K_kj = jax.lax.dynamic_index_in_dim(K, k, axis=-2)
    num, gap = K_ik - K_kj, wi - wj  # f[i,k,j] = (f[i,k] - f[k,j]) / (w_i - w_j)
    for num2, gap2 in ((K_ik - K, wk - wj), (K - K_kj, wi - wk)):  # f[k,i,j], f[i,j,k]
        wider = jnp.abs(gap2) > jnp.abs(gap)
        num, gap = jnp.where(wider, num2, num), jnp.where(wider, gap2, gap)
    slope = num / jnp.where(gap == 0, 1, gap)
    mean = (d2fw[..., :, None] + jax.lax.dynamic_index_in_dim(d2fw, k, axis=-1)[..., None] + d2fw[..., None, :]) / 6
    lost = eps ** (1 / 4) * (jnp.abs(K_ik) + jnp.abs(K_kj) + jnp.abs(K))
    noise = w.shape[-1] * eps * jnp.max(jnp.abs(w), axis=-1, keepdims=True)[..., None]
    near = (jnp.abs(gap) <= noise) | (lost > jnp.abs(gap) * jnp.maximum(jnp.abs(mean), jnp.abs(slope)))
    return jnp.where(near, mean, slope)


def _derivatives(f: Callable, df: Callable | None) -> tuple[Callable, Callable]:
    """f' (df, else jax.jvp of f) and f'' (jax.jvp of f'), elementwise."""
    def d1(w):
        return jax.jvp(f, (w,), (jnp.ones_like(w),))[1] if df is None else df(w)

    return d1, lambda w: jax.jvp(d1, (w,), (jnp.ones_like(w),))[1]


def _apply(A: jax.Array, f: Callable) -> jax.Array:
    w, v = jnp.linalg.eigh(_herm(A), symmetrize_input=False)
    return _sandwich(v, _diag(f(w)))


def _eigen_function(A: jax.Array, f: Callable, df: Callable | None):
    """(f(A), L) for Hermitian A = V diag(w) V^H: f(A) = V diag(f(w)) V^H and its derivative
    L(X) = V (K o (V^H herm(X) V)) V^H, self-adjoint: the pushforward and the pullback."""
    y, frame = _spectral(f, df, A)
    return y, lambda X: _daleckii_krein(f, df, frame, A, unthunk(X))


@partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _spectral(f: Callable, df: Callable | None, A: jax.Array) -> tuple[jax.Array, tuple]:
    """(f(A), (V, K)): the value, and the frame of L; differentiated by L, not through eigh,
    so that f(A) inside a rule's pullback (sqrtm(A) @ sqrtm(A)) has finite second derivatives."""
    w, v = jnp.linalg.eigh(_herm(A), symmetrize_input=False)
    fw = f(w)
    return _sandwich(v, _diag(fw)), (v, _divided_differences(w, fw, _derivatives(f, df)[0](w)))


@_spectral.defjvp
def _spectral_jvp(f, df, primals, tangents):
    (A,), (A_dot,) = primals, tangents
    y, frame = _spectral(f, df, A)  # the frame only feeds L, whose rule differentiates in A
    return (y, frame), (_daleckii_krein(f, df, frame, A, A_dot), jax.tree_util.tree_map(jnp.zeros_like, frame))


@partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _daleckii_krein(f: Callable, df: Callable | None, frame: tuple, A: jax.Array, X: jax.Array) -> jax.Array:
    """L(A)[X] = V (K o (V^H herm(X) V)) V^H, frame = (V, K) of A. Differentiated in A (and X)
    by the rule below, not through eigh: the second derivatives of f(A) are finite at
    repeated eigenvalues too."""
    v, K = frame
    return _sandwich(v, K * (_H(v) @ _herm(X) @ v))


@_daleckii_krein.defjvp
def _daleckii_krein_jvp(f, df, primals, tangents):
    """dL = V (K o R_dot + S) V^H with S_ij = sum_k f[w_i, w_k, w_j] (P_ik R_kj + R_ik P_kj),
    P, R, R_dot = A_dot, X, X_dot in the eigenbasis (the second-order Daleckii-Krein formula)."""
    (_, A, X), (_, A_dot, X_dot) = primals, tangents
    w, v = _held_eigh(A)
    d1, d2 = _derivatives(f, df)
    K, d2fw = _divided_differences(w, f(w), d1(w)), d2(w)
    P, R, R_dot = (_H(v) @ _herm(M) @ v for M in (A_dot, X, X_dot))

    def add(k, S):  # one k at a time: n^2 memory, not the n^3 of all f[w_i, w_k, w_j]
        P_k, R_k = (jax.lax.dynamic_index_in_dim(M, k, axis=-1) for M in (P, R))  # columns k
        Pk_, Rk_ = (jax.lax.dynamic_index_in_dim(M, k, axis=-2) for M in (P, R))  # rows k
        return S + _second_divided_differences(w, K, d2fw, k) * (P_k * Rk_ + R_k * Pk_)

    S = jax.lax.fori_loop(0, w.shape[-1], add, jnp.zeros(jnp.broadcast_shapes(P.shape, R.shape), R.dtype))
    return _sandwich(v, K * R), _sandwich(v, K * R_dot + S)


@jax.custom_jvp
def _held_eigh(A: jax.Array) -> tuple[jax.Array, jax.Array]:
    """eigh of herm(A), for the derivative of L: not to be differentiated (a third derivative)."""
    return jnp.linalg.eigh(_herm(A), symmetrize_input=False)


@_held_eigh.defjvp
def _held_eigh_jvp(primals, tangents):
    raise NotImplementedError(
        "Matrix functions of rules.library.linalg_matfun (sym_matrix_function, expm_sym, logm_spd, "
        "sqrtm_psd, svd_matrix_function): derivatives of order three and higher are not implemented (the "
        "second derivative is the second-order Daleckii-Krein formula; one more would "
        "differentiate eigh, NaN at repeated eigenvalues). For them, differentiate a plain-JAX "
        "implementation (e.g. jax.scipy.linalg.expm) instead."
    )


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
    identity), and loses digits near them. Second derivatives (`jax.hessian`) are exact
    there too, by second divided differences (f'' by `jax.jvp` of df); a third raises.

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

    The pushforward and the pullback are one self-adjoint map, `_svd_map`; g(A) and the map
    are differentiated by it (`_svd_spectral`), so that second derivatives do not go through
    the SVD's frame (undetermined at tied singular values).
    """
    if jnp.iscomplexobj(A):
        raise TypeError(
            "`svd_matrix_function`: complex matrices are not supported; expected a real array "
            f"(got {jnp.result_type(A)}); for a Hermitian matrix use `sym_matrix_function`."
        )
    wide = A.shape[-2] < A.shape[-1]
    turn = _mT if wide else (lambda X: X)
    B = turn(A)
    y, frame = _svd_spectral(f, df, B)

    def derivative(X):
        return turn(_svd_map(f, df, frame, B, turn(X)))

    return turn(y), derivative, derivative


@partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _svd_spectral(f: Callable, df: Callable | None, B: jax.Array) -> tuple[jax.Array, tuple]:
    """(g(B), frame) for B (m >= n), frame = (U, V, D1, D2, h) of `_svd_map`; differentiated by
    `_svd_map`, not through the SVD."""
    u, s, vt = jnp.linalg.svd(B, full_matrices=False)
    v = _mT(vt)
    fs = f(s)
    dfs = _derivatives(f, df)[0](s)
    D1 = _divided_differences(s, fs, dfs)
    total = s[..., :, None] + s[..., None, :]
    zero = total == 0
    D2 = jnp.where(zero, (dfs[..., :, None] + dfs[..., None, :]) / 2,
                   (fs[..., :, None] + fs[..., None, :]) / jnp.where(zero, 1, total))
    h = jnp.where(s == 0, dfs, fs / jnp.where(s == 0, 1, s))
    return (u * fs[..., None, :]) @ vt, (u, v, D1, D2, h)


@_svd_spectral.defjvp
def _svd_spectral_jvp(f, df, primals, tangents):
    (B,), (B_dot,) = primals, tangents
    y, frame = _svd_spectral(f, df, B)
    return (y, frame), (_svd_map(f, df, frame, B, B_dot), jax.tree_util.tree_map(jnp.zeros_like, frame))


@partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _svd_map(f: Callable, df: Callable | None, frame: tuple, B: jax.Array, X: jax.Array) -> jax.Array:
    """The derivative of g at B (m >= n) applied to X, its own adjoint (B_dot pushed forward, G
    pulled back): U (D1 o sym(P) + D2 o skew(P)) V^T, P = U^T X V, D1 the divided differences of
    f on the singular values (f' on ties), D2_ij = (f(s_i) + f(s_j)) / (s_i + s_j) (f' where both
    are 0), plus (I - U U^T) X V diag(f(s) / s) V^T for a tall B.

    These are the divided differences of the odd extension f(|w|) sign(w) on the eigenvalues
    +-s_i (and 0) of the Hermitian dilation [[0, B], [B^T, 0]]: g(B) is the top-right block of
    that matrix function, and the map the block of its Daleckii-Krein derivative. So the map is
    differentiated by the second-order Daleckii-Krein formula of the dilation (`_svd_map_jvp`):
    exact at tied and zero singular values. (At a rank-deficient B, g has second derivatives
    only where f''(0) = 0; elsewhere this is the mean of the one-sided ones.)
    """
    u, v, D1, D2, h = frame
    P = _mT(u) @ X @ v
    out = u @ (D1 * (P + _mT(P)) / 2 + D2 * (P - _mT(P)) / 2) @ _mT(v)
    if B.shape[-2] > B.shape[-1]:
        out = out + (X - u @ (_mT(u) @ X)) @ ((v * h[..., None, :]) @ _mT(v))
    return out


@_svd_map.defjvp
def _svd_map_jvp(f, df, primals, tangents):
    (frame, B, X), (_, B_dot, X_dot) = primals, tangents
    m = B.shape[-2]

    def dilation(Y):  # [[0, Y], [Y^T, 0]]
        zeros = jnp.zeros(Y.shape[:-2] + (m, m), Y.dtype), jnp.zeros(Y.shape[:-2] + (Y.shape[-1],) * 2, Y.dtype)
        return jnp.concatenate([jnp.concatenate([zeros[0], Y], -1), jnp.concatenate([_mT(Y), zeros[1]], -1)], -2)

    d1 = _derivatives(f, df)[0]
    _, dL = _daleckii_krein_jvp(lambda w: jnp.sign(w) * f(jnp.abs(w)), lambda w: d1(jnp.abs(w)),
                                (None, dilation(B), dilation(X)), (None, dilation(B_dot), dilation(X_dot)))
    return _svd_map(f, df, frame, B, X), dL[..., :m, m:]


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
    Second derivatives are exact at tied and zero singular values too (the second-order formula
    of the Hermitian dilation, `_svd_map`); a third derivative raises NotImplementedError.

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
