"""Linear algebra primitives: linear solves, triangular factors and least squares.

Each frule and rrule reuses the factorisation of its forward pass (LU, Cholesky, QR) for
the one or two solves of its pushforward or pullback; the rrule returns the cotangents of
the matrix as thunks, computed only when the matrix is differentiated. Complex arguments
use ChainRules' convention: for a real loss l, x_bar = dl/dRe x + i dl/dIm x (tangents are
plain). `cholesky` batches over leading axes; the solves take one matrix (use `jax.vmap`
for batches) and a right-hand side b of shape (n,) or (n, k).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

from .._primitive import primitive
from .._projection import ProjectTo
from .._thunks import thunk, unthunk
from .._zeros import NoTangent, ZeroTangent
from .linalg import _H, _M3, _M3Z, _M43, _SPD3, _V3, _V3Z, _diag, _herm, _is_zero, _nots, _pushed

__all__ = ["solve", "cholesky", "cho_solve", "triangular_solve", "lstsq"]

# ----- example inputs (with the matrices of rules.library.linalg) and helpers ---------------
_SPD3Z = _M3Z @ _M3Z.conj().T + np.eye(3)
_L3 = np.linalg.cholesky(_SPD3)
_B3 = np.array([[1.0, -0.5], [0.3, 2.0], [-1.1, 0.4]])
_B4 = np.array([[1.0, -0.5], [0.3, 2.0], [-1.1, 0.4], [0.7, 0.2]])


def _outer(u: jax.Array, v: jax.Array) -> jax.Array:
    """u v^H for vectors (n,), (m,) or column blocks (n, k), (m, k)."""
    if jnp.ndim(u) == 1:
        return jnp.outer(u, jnp.conj(v))
    return u @ _H(v)


def _moved(x_dot, a_dot, x):
    """x_dot - a_dot @ x, either tangent possibly zero: the right-hand side of a solve's tangent."""
    if _is_zero(a_dot):
        return x_dot
    return -(a_dot @ x) if _is_zero(x_dot) else x_dot - a_dot @ x


# ----- solve --------------------------------------------------------------------------------
@primitive(examples=[(_M3, _B3), (_M3Z, _V3Z)])
def solve(A: jax.Array, b: jax.Array) -> jax.Array:
    """x = A^{-1} b for one square A and b of shape (n,) or (n, k).

    Why a rule: A is factorised once (LU) and the pullback reuses the factors for its one
    solve with A^H: b_bar = A^{-H} x_bar, A_bar = -b_bar x^H (a thunk, computed only when A
    is differentiated).

    Args:
      A: an (n, n) array.
      b: an (n,) or (n, k) array.

    Returns:
      x, of b's shape.

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg_solve import solve
    >>> solve(jnp.array([[2.0, 0.0], [0.0, 4.0]]), jnp.array([1.0, 1.0])).tolist()
    [0.5, 0.25]

    See also: `rules.library.linalg.inv`, `cho_solve`, `triangular_solve`, `lstsq`.
    """
    return jnp.linalg.solve(A, b)


@solve.frule
def solve_frule(tangents, A, b):
    _, A_dot, b_dot = tangents
    factors = jsl.lu_factor(A)
    x = jsl.lu_solve(factors, b)

    def solve_pushforward(A_dot, b_dot):  # A^{-1} (b_dot - A_dot x)
        return jsl.lu_solve(factors, _moved(b_dot, A_dot, x))

    return x, _pushed(solve_pushforward, A_dot, b_dot)


@solve.rrule
def solve_rrule(A, b):
    project_A, project_b = ProjectTo(A), ProjectTo(b)
    factors = jsl.lu_factor(A)
    x = jsl.lu_solve(factors, b)
    trans = 2 if jnp.iscomplexobj(A) or jnp.iscomplexobj(b) else 1

    def solve_pullback(x_bar):
        b_bar = jsl.lu_solve(factors, unthunk(x_bar), trans=trans)
        return NoTangent(), thunk(lambda: project_A(-_outer(b_bar, x))), project_b(b_bar)

    return x, solve_pullback


# ----- cholesky -----------------------------------------------------------------------------
@primitive(examples=[(_SPD3.astype(np.float32),), (_SPD3Z,)])
def cholesky(A: jax.Array) -> jax.Array:
    """The lower Cholesky factor L (A = L L^H) of the Hermitian part of A.

    Why a rule: the pullback is closed form with two triangular solves against L,
    A_bar = herm(L^{-H} Phi(L^H L_bar) L^{-1}) (Phi: the lower triangle with a halved
    diagonal). The function reads only A's Hermitian part, (A + A^H) / 2, so its cotangent
    is Hermitian and agrees with finite differences in every entry.

    Args:
      A: an array (..., n, n), Hermitian positive definite.

    Returns:
      L, lower triangular with a positive diagonal.

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg_solve import cholesky
    >>> cholesky(jnp.array([[4.0, 2.0], [2.0, 5.0]])).tolist()
    [[2.0, 0.0], [1.0, 2.0]]

    See also: `cho_solve`, `triangular_solve`.
    """
    return jnp.linalg.cholesky(_herm(A), symmetrize_input=False)


@cholesky.frule
def cholesky_frule(tangents, A):
    _, A_dot = tangents
    L = jnp.linalg.cholesky(_herm(A), symmetrize_input=False)

    def cholesky_pushforward(A_dot):  # L Phi(L^{-1} herm(A_dot) L^{-H})
        X = jsl.solve_triangular(L, _herm(A_dot), lower=True)  # L^{-1} herm(A_dot)
        S = jsl.solve_triangular(L, _H(X), lower=True)  # L^{-1} herm(A_dot) L^{-H}, Hermitian
        diag = jnp.real(jnp.diagonal(S, axis1=-2, axis2=-1))  # real, as L's diagonal stays
        return L @ (jnp.tril(S, -1) + _diag(diag / 2))

    return L, _pushed(cholesky_pushforward, A_dot)


@cholesky.rrule
def cholesky_rrule(A):
    project_A = ProjectTo(A)
    L = jnp.linalg.cholesky(_herm(A), symmetrize_input=False)

    def cholesky_pullback(L_bar):
        M = _H(L) @ jnp.tril(unthunk(L_bar))
        P = jnp.tril(M, -1) + 0.5 * jnp.triu(jnp.tril(M))  # lower triangle, halved diagonal
        X = jsl.solve_triangular(L, P, lower=True, trans="C")  # L^{-H} P
        S = _H(jsl.solve_triangular(L, _H(X), lower=True, trans="C"))  # L^{-H} P L^{-1}
        return NoTangent(), project_A(_herm(S))

    return L, cholesky_pullback


# ----- cho_solve ----------------------------------------------------------------------------
@primitive(examples=[(_L3 + np.triu(_M3, 1), _V3), (_L3.T.astype(np.float32), _B3.astype(np.float32), False)])
def cho_solve(c: jax.Array, b: jax.Array, lower: bool = True) -> jax.Array:
    """x = A^{-1} b for A = c c^H (lower) or c^H c (upper), given the Cholesky factor c.

    Why a rule: differentiable in the factor c as well as in b, by one more solve with the
    same factor: b_bar = A^{-1} x_bar, c_bar = -tril((b_bar x^H + x b_bar^H) tril(c))
    (upper: -triu(triu(c) (...))). Only c's triangle is read, so its cotangent is
    triangular and independent of the other triangle, which may hold anything (as
    `scipy.linalg.cho_factor` leaves it): second derivatives are those of the triangle.

    Args:
      c: an (n, n) triangular Cholesky factor, e.g. `cholesky(A)`.
      b: an (n,) or (n, k) array.
      lower: whether c is lower (the default, as `cholesky` returns) or upper triangular.

    Returns:
      x, of b's shape.

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg_solve import cho_solve, cholesky
    >>> A = jnp.array([[4.0, 2.0], [2.0, 5.0]])
    >>> cho_solve(cholesky(A), A @ jnp.array([1.0, -1.0])).round(6).tolist()
    [1.0, -1.0]

    See also: `cholesky`, `solve`, `jax.scipy.linalg.cho_solve`.
    """
    return jsl.cho_solve((c, lower), b)


@cho_solve.frule
def cho_solve_frule(tangents, c, b, *options, lower=True):
    _, c_dot, b_dot, *_ = tangents
    (lower,) = options or (lower,)
    part = jnp.tril if lower else jnp.triu
    x = jsl.cho_solve((c, lower), b)

    def cho_solve_pushforward(c_dot, b_dot):  # A^{-1} (b_dot - A_dot x), A_dot from c's triangle
        A_dot = ZeroTangent()
        if not _is_zero(c_dot):
            t, t_dot = part(c), part(c_dot)  # only c's triangle is read, and only its tangent
            A_dot = t_dot @ _H(t) + t @ _H(t_dot) if lower else _H(t_dot) @ t + _H(t) @ t_dot
        return jsl.cho_solve((c, lower), _moved(b_dot, A_dot, x))

    return x, _pushed(cho_solve_pushforward, c_dot, b_dot)


@cho_solve.rrule
def cho_solve_rrule(c, b, *options, lower=True):
    (lower,) = options or (lower,)
    project_c, project_b = ProjectTo(c), ProjectTo(b)
    part = jnp.tril if lower else jnp.triu
    x = jsl.cho_solve((c, lower), b)

    def cho_solve_pullback(x_bar):
        b_bar = jsl.cho_solve((c, lower), unthunk(x_bar))

        def c_bar():  # only c's triangle is read: the other one holds anything (e.g. A's entries)
            S = _outer(b_bar, x)
            S = -(S + _H(S))
            t = part(c)
            return project_c(part(S @ t if lower else t @ S))

        return (NoTangent(), thunk(c_bar), project_b(b_bar)) + _nots(len(options))

    return x, cho_solve_pullback


# ----- triangular_solve ---------------------------------------------------------------------
@primitive(examples=[(np.tril(_M3Z), _V3Z), (_L3.T.astype(np.float32), _B3.astype(np.float32), False)])
def triangular_solve(a: jax.Array, b: jax.Array, lower: bool = True) -> jax.Array:
    """x = a^{-1} b for a triangular a, reading only a's lower (or upper) triangle.

    Why a rule: the pullback is one triangular solve with a^H, b_bar = a^{-H} x_bar, and
    a_bar = -tril(b_bar x^H) (triu when upper), triangular as the read entries are.

    Args:
      a: an (n, n) array; only its lower (upper) triangle is used.
      b: an (n,) or (n, k) array.
      lower: which triangle of a to use.

    Returns:
      x, of b's shape.

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg_solve import triangular_solve
    >>> triangular_solve(jnp.array([[2.0, 0.0], [1.0, 1.0]]), jnp.array([2.0, 3.0])).tolist()
    [1.0, 2.0]

    See also: `cho_solve`, `solve`, `jax.scipy.linalg.solve_triangular`.
    """
    return jsl.solve_triangular(a, b, lower=lower)


@triangular_solve.frule
def triangular_solve_frule(tangents, a, b, *options, lower=True):
    _, a_dot, b_dot, *_ = tangents
    (lower,) = options or (lower,)
    part = jnp.tril if lower else jnp.triu
    x = jsl.solve_triangular(a, b, lower=lower)

    def triangular_solve_pushforward(a_dot, b_dot):  # a^{-1} (b_dot - part(a_dot) x)
        a_dot = a_dot if _is_zero(a_dot) else part(a_dot)
        return jsl.solve_triangular(a, _moved(b_dot, a_dot, x), lower=lower)

    return x, _pushed(triangular_solve_pushforward, a_dot, b_dot)


@triangular_solve.rrule
def triangular_solve_rrule(a, b, *options, lower=True):
    (lower,) = options or (lower,)
    project_a, project_b = ProjectTo(a), ProjectTo(b)
    x = jsl.solve_triangular(a, b, lower=lower)

    def triangular_solve_pullback(x_bar):
        b_bar = jsl.solve_triangular(a, unthunk(x_bar), lower=lower, trans="C")
        part = jnp.tril if lower else jnp.triu
        return (NoTangent(), thunk(lambda: project_a(part(-_outer(b_bar, x)))), project_b(b_bar)) + _nots(
            len(options)
        )

    return x, triangular_solve_pullback


# ----- lstsq --------------------------------------------------------------------------------
@primitive(examples=[(_M43, _B4[:, 0]), (_M43.astype(np.float32), _B4.astype(np.float32))])
def lstsq(A: jax.Array, b: jax.Array) -> jax.Array:
    """The least-squares solution x = argmin ||A x - b|| for A of full column rank.

    Why a rule: one QR factorisation (A = Q R) serves the forward pass and the pullback,
    b_bar = Q R^{-H} x_bar, A_bar = -b_bar x^H + r z^H with r = b - A x and z = R^{-1}
    R^{-H} x_bar. JAX differentiates `jnp.linalg.lstsq` through an SVD, which is NaN at
    repeated singular values (e.g. orthonormal columns); this rule is finite there.

    Args:
      A: an (m, n) array, m >= n, of rank n.
      b: an (m,) or (m, k) array.

    Returns:
      x, (n,) or (n, k).

    >>> import jax.numpy as jnp
    >>> from rules.library.linalg_solve import lstsq
    >>> lstsq(jnp.array([[1.0], [1.0]]), jnp.array([1.0, 3.0])).tolist()
    [2.0]

    See also: `rules.library.linalg.pinv`, `solve`.
    """
    q, r = jnp.linalg.qr(A)
    return jsl.solve_triangular(r, _H(q) @ b, lower=False)


@lstsq.frule
def lstsq_frule(tangents, A, b):
    _, A_dot, b_dot = tangents
    q, r = jnp.linalg.qr(A)
    x = jsl.solve_triangular(r, _H(q) @ b, lower=False)

    def lstsq_pushforward(A_dot, b_dot):  # (A^H A)^{-1} (A^H (b_dot - A_dot x) + A_dot^H (b - A x))
        w = _H(q) @ _moved(b_dot, A_dot, x)  # R^{-H} A^H v = Q^H v
        if not _is_zero(A_dot):
            w = w + jsl.solve_triangular(r, _H(A_dot) @ (b - A @ x), lower=False, trans="C")
        return jsl.solve_triangular(r, w, lower=False)

    return x, _pushed(lstsq_pushforward, A_dot, b_dot)


@lstsq.rrule
def lstsq_rrule(A, b):
    project_A, project_b = ProjectTo(A), ProjectTo(b)
    q, r = jnp.linalg.qr(A)
    x = jsl.solve_triangular(r, _H(q) @ b, lower=False)

    def lstsq_pullback(x_bar):
        w = jsl.solve_triangular(r, unthunk(x_bar), lower=False, trans="C")  # R^{-H} x_bar
        b_bar = q @ w

        def A_bar():
            z = jsl.solve_triangular(r, w, lower=False)
            return project_A(_outer(b - A @ x, z) - _outer(b_bar, x))

        return NoTangent(), thunk(A_bar), project_b(b_bar)

    return x, lstsq_pullback

