"""The polar decomposition, differentiable wherever the matrix has full rank.

`jax.scipy.linalg.polar` differentiates its iteration (QDWH: no reverse mode) or its SVD
(NaN at repeated singular values, so at every orthogonal matrix); `polar` here differentiates
the decomposition itself (see its docstring). Split from `rules.library.linalg_spectral`,
whose helpers it shares.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

from .._primitive import primitive
from .._projection import ProjectTo
from .._thunks import unthunk
from .._zeros import NoTangent, ZeroTangent
from .linalg import _H, _diag, _herm, _is_zero, _nots, _pushed, _sandwich
from .linalg_spectral import _M3Z, _M43, _nan_where

__all__ = ["polar"]


# ----- polar --------------------------------------------------------------------------------
_ROTATION = np.array([[np.cos(0.3), -np.sin(0.3), 0.0], [np.sin(0.3), np.cos(0.3), 0.0], [0.0, 0.0, 1.0]])


def _polar_factors(A: jax.Array, side: str, options: dict) -> tuple[jax.Array, jax.Array, tuple]:
    """(U, P, frame) of the right polar decomposition B = U P of B = A (side "right") or A^H
    ("left"): U, P as `jax.scipy.linalg.polar` computes them, frame = (W, s) of P = W diag(s) W^H
    by eigh. Differentiated by `_polar_tangent` (not through the iteration or eigh), so the
    rules' own derivatives, and those of any order, are exact at repeated singular values."""
    if side not in ("right", "left"):
        raise ValueError(f"`polar`: side must be 'right' or 'left'; got {side!r}.")

    @jax.custom_jvp
    def factors(A):
        u, p = jsl.polar(A, side, **options)
        s, w = jnp.linalg.eigh(_herm(p), symmetrize_input=False)
        return (u if side == "right" else _H(u)), p, (w, s)

    @factors.defjvp
    def factors_jvp(primals, tangents):
        (A,), (A_dot,) = primals, tangents
        u, p, frame = factors(A)
        u_dot, p_dot = _polar_tangent(u, p, frame, A_dot if side == "right" else _H(A_dot))
        return (u, p, frame), (u_dot, p_dot, jax.tree_util.tree_map(jnp.zeros_like, frame))

    return factors(A)


def _deficient(frame: tuple) -> jax.Array:
    """Rank deficient: min s <= sqrt(eps) max s (the tangents are NaN there)."""
    s = frame[1]
    return (jnp.min(s, axis=-1) <= np.sqrt(np.finfo(s.dtype).eps) * jnp.max(s, axis=-1))[..., None, None]


@jax.custom_jvp
def _sylvester(frame: tuple, P: jax.Array, Y: jax.Array) -> jax.Array:
    """Omega with Omega P + P Omega = Y, for P = W diag(s) W^H (frame = (W, s), s > 0):
    W ((W^H Y W) / (s_i + s_j)) W^H. Differentiated in P (dOmega solves the same equation for
    dY - Omega dP - dP Omega), never through the eigenvectors: exact at repeated s."""
    w, s = frame
    safe = jnp.where(s > 0, s, 1)
    return _sandwich(w, (_H(w) @ Y @ w) / (safe[..., :, None] + safe[..., None, :]))


@_sylvester.defjvp
def _sylvester_jvp(primals, tangents):
    (frame, P, Y), (_, P_dot, Y_dot) = primals, tangents
    omega = _sylvester(frame, P, Y)
    return omega, _sylvester(frame, P, Y_dot - omega @ P_dot - P_dot @ omega)


@jax.custom_jvp
def _inverse(frame: tuple, P: jax.Array) -> jax.Array:
    """P^{-1} = W diag(1/s) W^H, differentiated in P: -P^{-1} dP P^{-1}."""
    w, s = frame
    return _sandwich(w, _diag(1 / jnp.where(s > 0, s, 1)))


@_inverse.defjvp
def _inverse_jvp(primals, tangents):
    (frame, P), (_, P_dot) = primals, tangents
    P_inv = _inverse(frame, P)
    return P_inv, -P_inv @ P_dot @ P_inv


def _polar_tangent(u, p, frame, B_dot):
    """(U_dot, P_dot) of B = U P (right): X = U^H B_dot = Omega P + P_dot with Omega skew-Hermitian,
    so Omega P + P Omega = X - X^H (`_sylvester`); P_dot = herm(X) - (Omega P - P Omega) / 2;
    U_dot = U Omega + (I - U U^H) B_dot P^{-1} (tall B)."""
    X = _H(u) @ B_dot
    omega = _sylvester(frame, p, X - _H(X))
    u_dot = u @ omega
    if u.shape[-2] > u.shape[-1]:
        u_dot = u_dot + (B_dot - u @ X) @ _inverse(frame, p)
    p_dot = _herm(X) - (omega @ p - p @ omega) / 2
    return _nan_where(_deficient(frame), u_dot), _nan_where(_deficient(frame), p_dot)


def _polar_cotangent(u, p, frame, u_bar, p_bar):
    """B_bar of B = U P (right), the transpose of `_polar_tangent`: with
    M = U^H U_bar - (P_bar P - P P_bar) / 2 and Z solving Z P + P Z = M (`_sylvester`),
    B_bar = U (Z - Z^H + herm(P_bar)) + (I - U U^H) U_bar P^{-1} (tall B)."""
    n = p.shape[-1]
    M = jnp.zeros(p.shape, u.dtype)
    inner = jnp.zeros(p.shape, u.dtype)
    B_bar = jnp.zeros(u.shape, u.dtype)
    if not _is_zero(u_bar):
        M = M + _H(u) @ u_bar
        if u.shape[-2] > n:
            B_bar = B_bar + (u_bar - u @ (_H(u) @ u_bar)) @ _inverse(frame, p)
    if not _is_zero(p_bar):
        p_bar = jnp.asarray(p_bar, u.dtype)
        M = M - (p_bar @ p - p @ p_bar) / 2
        inner = inner + _herm(p_bar)
    Z = _sylvester(frame, p, M)
    B_bar = B_bar + u @ (inner + Z - _H(Z))
    return _nan_where(_deficient(frame), B_bar)


@primitive(examples=[(_M43[:3],), (_ROTATION,), (_ROTATION.astype(np.float32),), (_M43,), (_M3Z,), (_M43.T, "left"),
                     (_M3Z[:2], "left")])
def polar(a: jax.Array, side: str = "right", *, method: str = "qdwh", eps: float | None = None,
          max_iterations: int | None = None) -> tuple[jax.Array, jax.Array]:
    """The polar decomposition, as `jax.scipy.linalg.polar`: a = u p (side="right") or p u ("left").

    Why a rule: polar is smooth wherever a has full rank, but JAX differentiates its
    iteration (method "qdwh": reverse mode is an error) or its SVD (method "svd": 1/(s_j^2 -
    s_i^2) terms, NaN or wrong at repeated singular values, e.g. at every orthogonal
    matrix). The rule differentiates the decomposition itself: for a = U P, U^H da =
    Omega P + dP with Omega skew-Hermitian, so Omega P + P Omega = X - X^H (X = U^H da),
    solved in P's eigenbasis with denominators s_i + s_j > 0; dP = herm(X) - (Omega P -
    P Omega) / 2, and dU = U Omega + (I - U U^H) da P^{-1} for a tall a; the pullback is
    its transpose. The solve and P^{-1} are differentiated in P (not through P's
    eigenvectors), so second and higher derivatives are exact too, at repeated singular
    values as well. side="left" is the right decomposition of a^H. At a rank-deficient a
    (min s <= sqrt(eps) max s) u is not unique and p not differentiable: the tangents and
    cotangents are NaN there.

    Args:
      a: an array (m, n), real or complex: m >= n for side="right", m <= n for "left" (as
        JAX's qdwh; method="svd" takes any).
      side: "right" (a = u p, p (n, n)) or "left" (a = p u, p (m, m)).
      method, eps, max_iterations: passed to `jax.scipy.linalg.polar` for the value.

    Returns:
      (u, p): u with orthonormal columns (right; rows: left), p Hermitian positive
      semidefinite.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.linalg_polar import polar
    >>> R = jnp.array([[0.0, -1.0], [1.0, 0.0]])  # a rotation: u = R, p = I
    >>> (jax.grad(lambda a: polar(a)[0][0, 0])(R) + 0.0).round(6).tolist()  # JAX: an error (qdwh)
    [[0.5, 0.0], [0.0, 0.5]]

    See also: `svd`, `rules.library.linalg_matfun.sqrtm_psd`, `jax.scipy.linalg.polar`.
    """
    return jsl.polar(a, side, method=method, eps=eps, max_iterations=max_iterations)


def _polar_side(options: tuple, side: str) -> str:
    (side,) = options or (side,)
    return side


@polar.frule
def polar_frule(tangents, a, *options, side="right", **kw_options):
    _, a_dot, *_ = tangents
    side = _polar_side(options, side)
    u, p, frame = _polar_factors(a, side, kw_options)
    y = (u if side == "right" else _H(u)), p

    def polar_pushforward(a_dot):
        u_dot, p_dot = _polar_tangent(u, p, frame, a_dot if side == "right" else _H(a_dot))
        return (u_dot if side == "right" else _H(u_dot)), p_dot

    return y, _pushed(polar_pushforward, a_dot)


@polar.rrule
def polar_rrule(a, *options, side="right", **kw_options):
    side = _polar_side(options, side)
    project_a = ProjectTo(a)
    u, p, frame = _polar_factors(a, side, kw_options)
    y = (u if side == "right" else _H(u)), p

    def polar_pullback(y_bar):
        u_bar, p_bar = unthunk(y_bar)
        if _is_zero(u_bar) and _is_zero(p_bar):
            return (NoTangent(), ZeroTangent()) + _nots(len(options))
        u_bar = u_bar if side == "right" or _is_zero(u_bar) else _H(u_bar)
        a_bar = _polar_cotangent(u, p, frame, u_bar, p_bar)
        return (NoTangent(), project_a(a_bar if side == "right" else _H(a_bar))) + _nots(len(options))

    return y, polar_pullback
