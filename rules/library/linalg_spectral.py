"""Spectral linear algebra primitives: eigh, eigvalsh, svd, svdvals.

Each has an frule (forward mode) and an rrule (reverse mode), one the transpose of the
other, with the same conventions. Functions of Hermitian matrices (`sym_matrix_function`,
`sqrtm_psd`, `expm_sym`, `logm_spd`) are in `rules.library.linalg_matfun` and importable
from here too. Conventions:

* Hermitian-input functions (`eigh`, `eigvalsh`, and the matrix functions) read only the
  Hermitian part of their input: they compute A -> (A + A^H) / 2 first. Their cotangents
  are therefore Hermitian, and they agree with finite differences taken over every entry
  of A; their tangents depend on the Hermitian part of the input's tangent alone.
* Degenerate spectra: never a finite wrong number. A pullback (and a pushforward) through
  eigenvectors has terms 1/(w_j - w_i) (eigh) or 1/(s_j^2 - s_i^2) (svd), infinite on
  repeated values. A pair counts as degenerate when |w_i - w_j| <= sqrt(eps) * max|w| (eps
  of the dtype); singular values s <= sqrt(eps) * max(s) count as 0 in the 1/s terms (which
  exist where A is not square, and for complex A). For a degenerate pair (i, j), i != j, the
  true contribution is the limit of (G_ij - conj(G_ji)) / (w_j - w_i), G = V^H V_bar, which
  the cotangent at the point does not determine: sum(V diag(w) V^H) (a nonzero limit) and a
  projector onto the block (a zero one) give the same kind of G there. So:
  - reverse mode: where a degenerate pair has G_ij or G_ji beyond roundoff (64 n eps max|G|;
    svd: J = U^H U_bar or K = V^H V_bar), or a zero singular value's 1/s_i terms meet a
    cotangent of its triplet (s_bar_i, or u_bar_i / v_bar_i where that side divides by s_i),
    the whole cotangent of that matrix is NaN. Where the cotangent has no component in a
    degenerate block (losses of the values alone, of eigenvectors with a gap, losses that do
    not see rotations in the block such as trace(V diag(g(w)) V^H)), the pair's term is
    dropped and the result is exact. What the rule cannot see: a cotangent that vanishes at
    the point but not nearby (e.g. sum(V diag(w - 1) V^H) at A = I, where V_bar = 0) still has
    its pair terms dropped; write such losses as spectral functions.
  - forward mode: the tangent of a vector in a degenerate block, where the tangent's
    K = V^H herm(A_dot) V (svd: U^H A_dot V) has off-diagonal entries in its row or column
    beyond roundoff, is NaN (its first-order formula is 0/0 or misses second-order terms);
    so is u_i (v_i) of a zero singular value whose 1/s_i term has a numerator beyond roundoff.
    The values' tangents and the other vectors' are finite.
  For spectral functions f(A) = V diag(f(w)) V^H, whose derivative is determined at
  repeated eigenvalues, use `rules.library.linalg_matfun.sym_matrix_function` (divided
  differences, Daleckii-Krein); for U diag(f(s)) V^T, `svd_matrix_function` there.
* Phase convention. Eigenvectors and singular vector pairs are only determined up to a
  sign (a phase), and backends (LAPACK, cuSOLVER's Jacobi, batched or not) choose it
  differently. `eigh` and `svd` fix it: each eigenvector v_i, and each pair (u_i, v_i)
  through v_i, is turned so that its pivot entry is real and positive, the pivot being the
  first entry within a relative sqrt(eps) of the largest magnitude (so exact ties, as in
  (1, -1) / sqrt(2), resolve alike whatever the rounding). The outputs are then functions
  of A, smooth where the pivot is unambiguous and the values are distinct (and nonzero:
  svd), and the rules return their derivative: the usual gauge-free formula plus, for
  complex arguments, the convention's phase term (`_with_phase_term`, `_with_phase_turn`).
* Complex arguments use ChainRules' convention (x_bar = dl/dRe x + i dl/dIm x).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._primitive import primitive
from .._projection import ProjectTo
from .._thunks import unthunk
from .._zeros import NoTangent
from .linalg import _H, _Q3, _S3, _S3Z, _diag, _herm, _is_zero, _pushed, _sandwich  # noqa: F401
from .linalg_matfun import expm_sym as expm_sym
from .linalg_matfun import logm_spd as logm_spd
from .linalg_matfun import sqrtm_psd as sqrtm_psd
from .linalg_matfun import sym_matrix_function as sym_matrix_function

__all__ = ["eigh", "eigvalsh", "svd", "svdvals"]

# ----- example inputs (and _S3, _S3Z): distinct, well separated values ----------------------
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


def _beyond_roundoff(x: jax.Array, *scales: jax.Array) -> jax.Array:
    """|x| > 64 n eps max|scale| (per matrix of a batch; n the last axis' length): an entry the
    rounding of the products that made x cannot explain."""
    top = jnp.zeros(x.shape[:-2] + (1, 1), jnp.abs(x).dtype)
    for scale in scales:
        a = jnp.abs(scale)
        top = jnp.maximum(top, jnp.max(a.reshape(a.shape[:-2] + (-1,)), axis=-1)[..., None, None])
    eps = np.finfo(top.dtype).eps
    return jnp.abs(x) > 64 * x.shape[-1] * eps * top


def _off_diagonal(mask: jax.Array) -> jax.Array:
    """mask without its diagonal (the last two axes)."""
    return mask & ~jnp.eye(mask.shape[-1], dtype=bool)[(None,) * (mask.ndim - 2)]


def _mixes_a_degenerate_block(w: jax.Array, *Gs: jax.Array) -> jax.Array:
    """(...,) bool: whether some degenerate pair i != j of w has G_ij or G_ji beyond roundoff (any G).

    There the pullback's term (G_ij - conj(G_ji)) / (w_j - w_i) is 0/0 at best: its limit, which
    the derivative needs, is not determined by the cotangent at the point (module docstring).
    """
    pairs = _off_diagonal(_degenerate(w))
    hit = jnp.zeros(pairs.shape, bool)
    for G in Gs:
        big = _beyond_roundoff(G, *Gs)
        hit = hit | big | jnp.swapaxes(big, -1, -2)
    return jnp.any(pairs & hit, axis=(-2, -1))


def _moving_in_a_degenerate_block(w: jax.Array, K: jax.Array) -> jax.Array:
    """(..., 1, n) bool: columns i with a degenerate partner j != i whose row or column i of the
    tangent's K has an off-diagonal entry beyond roundoff: there the vector's tangent is not
    determined (the first-order formula has 0/0 or misses second-order terms; module docstring)."""
    partnered = jnp.any(_off_diagonal(_degenerate(w)), axis=-1)
    big = _off_diagonal(_beyond_roundoff(K, K))
    moved = jnp.any(big | jnp.swapaxes(big, -1, -2), axis=-1)
    return (partnered & moved)[..., None, :]


def _nan_where(bad: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.where(bad, jnp.asarray(np.nan, x.dtype), x)


def _diag_sandwich(V: jax.Array, X: jax.Array, W: jax.Array | None = None) -> jax.Array:
    """Re diag(V^H X W) (W defaults to V), without the off-diagonal entries."""
    return jnp.real(jnp.sum(jnp.conj(V) * (X @ (V if W is None else W)), axis=-2))


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


def _with_phase_turn(v: jax.Array, k: jax.Array, v_dot: jax.Array, *pairs) -> tuple:
    """(v_dot, *x_dots) turned to the phase convention, for complex v (else unchanged).

    The forward form of `_with_phase_term`: the gauge-free tangent v_dot would make pivot
    v[k_i, i] complex; the convention turns vector pair i by i theta_i, theta_i =
    -Im(v_dot[k_i, i]) / v[k_i, i], adding i theta_i x_i to each x_dot (v's and those of
    `pairs`, given as (x, x_dot)).
    """
    dots = (v_dot, *(x_dot for _, x_dot in pairs))
    if not jnp.iscomplexobj(v):
        return dots
    pivot_dot = jnp.take_along_axis(v_dot, k[..., None, :], axis=-2)
    pivot = jnp.real(jnp.take_along_axis(v, k[..., None, :], axis=-2))
    turn = -1j * jnp.imag(pivot_dot) / pivot
    return tuple(x_dot + x * turn for x, x_dot in zip((v, *(x for x, _ in pairs)), dots))


# ----- eigh ---------------------------------------------------------------------------------
@primitive(examples=[(_S3,), (_S3.astype(np.float32),), (_S3Z,)])
def eigh(A: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Eigenvalues (ascending) and eigenvectors of the Hermitian part of A.

    Why a rule: the eigenvectors' phases follow one convention on every backend and the
    rule is the derivative of that function (module docstring). JAX's eigh pullback
    divides by eigenvalue gaps and is NaN at repeated eigenvalues (and inaccurate at
    nearly repeated ones) even for losses that ignore the choice of eigenvectors (e.g.
    trace(V diag(g(w)) V^H)); here a degenerate pair's term is dropped where the
    cotangent has no component in its block, and the cotangent is NaN where it has one
    (the derivative is not determined there, e.g. sum(V diag(w) V^H) at A = I, true
    gradient all ones); in forward mode the tangents of vectors moved inside a degenerate
    block are NaN (module docstring). The 1/(w_j - w_i) terms are skipped entirely when
    the eigenvectors get no cotangent, and the cotangent is Hermitian (the function reads
    (A + A^H) / 2). For spectral functions use `sym_matrix_function` instead.

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


@eigh.frule
def eigh_frule(tangents, A):
    _, A_dot = tangents
    w, v, k = _eigh(A)

    def eigh_pushforward(A_dot):  # K = V^H herm(A_dot) V: w_dot = diag K, v_dot = V (F o K) turned
        K = _H(v) @ _herm(A_dot) @ v
        w_dot = jnp.real(jnp.diagonal(K, axis1=-2, axis2=-1))
        (v_dot,) = _with_phase_turn(v, k, v @ (_inverse_gaps(w, w) * K))
        return w_dot, _nan_where(_moving_in_a_degenerate_block(w, K), v_dot)

    return (w, v), _pushed(eigh_pushforward, A_dot)


@eigh.rrule
def eigh_rrule(A):
    project_A = ProjectTo(A)
    w, v, k = _eigh(A)

    def eigh_pullback(y_bar):
        w_bar, v_bar = unthunk(y_bar)
        v_bar = _with_phase_term(v, k, v_bar)
        inner = jnp.zeros(v.shape, v.dtype)
        undetermined = jnp.zeros(w.shape[:-1], bool)
        if not _is_zero(w_bar):
            inner = inner + _diag(w_bar)
        if not _is_zero(v_bar):
            G = _H(v) @ v_bar
            inner = inner + _inverse_gaps(w, w) * G
            undetermined = _mixes_a_degenerate_block(w, G)
        A_bar = _herm(_sandwich(v, inner))
        return NoTangent(), project_A(_nan_where(undetermined[..., None, None], A_bar))

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


@eigvalsh.frule
def eigvalsh_frule(tangents, A):
    _, A_dot = tangents
    w, v = jnp.linalg.eigh(_herm(A), symmetrize_input=False)

    def eigvalsh_pushforward(A_dot):  # Re v_i^H A_dot v_i = v_i^H herm(A_dot) v_i
        return _diag_sandwich(v, A_dot)

    return w, _pushed(eigvalsh_pushforward, A_dot)


@eigvalsh.rrule
def eigvalsh_rrule(A):
    project_A = ProjectTo(A)
    w, v = jnp.linalg.eigh(_herm(A), symmetrize_input=False)

    def eigvalsh_pullback(w_bar):
        return NoTangent(), project_A(_sandwich(v, _diag(jnp.real(unthunk(w_bar)))))

    return w, eigvalsh_pullback


# ----- svd ----------------------------------------------------------------------------------
def _tiny(s: jax.Array) -> jax.Array:
    """Singular values s <= sqrt(eps) max(s): treated as 0 in the 1/s terms."""
    return s <= np.sqrt(np.finfo(s.dtype).eps) * jnp.max(s, axis=-1, keepdims=True)


def _svd_weights(s: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(F, 1/s): F_ij = 1/(s_j^2 - s_i^2) and 1/s, 0 on degenerate pairs and tiny s."""
    tiny = _tiny(s)
    return _inverse_gaps(s, s * s), jnp.where(tiny, 0, 1 / jnp.where(tiny, 1, s))


def _columns_beyond_roundoff(x: jax.Array, *scales: jax.Array) -> jax.Array:
    """(..., k) bool: the columns of x with an entry beyond roundoff (relative to the scales)."""
    return jnp.any(_beyond_roundoff(x, *scales), axis=-2)


def _svd_tangent(u, s, v, A_dot):
    """(u_dot, s_dot, v_dot), gauge-free (diag(V^H v_dot) = 0), for A = U diag(s) V^H (thin).

    With P = U^H A_dot V: s_dot = Re diag P, u_dot = U (F o (P S + S P^H) + i Im(diag P) / S)
    + (I - U U^H) A_dot V / S, v_dot = V (F o (S P + P^H S)) + (I - V V^H) A_dot^H U / S.
    NaN in the columns of u_dot, v_dot that are not determined (module docstring): a degenerate
    pair moved by P, or a tiny s_i whose 1/s_i term has a numerator beyond roundoff.
    """
    F, s_inv = _svd_weights(s)
    AV, AHU = A_dot @ v, _H(A_dot) @ u
    P = _H(u) @ AV
    p = jnp.diagonal(P, axis1=-2, axis2=-1)
    u_inner = F * (P * s[..., None, :] + s[..., :, None] * _H(P))
    v_inner = F * (s[..., :, None] * P + _H(P) * s[..., None, :])
    tiny, moved = _tiny(s), _moving_in_a_degenerate_block(s, P)
    u_off, v_off = AV - u @ P, AHU - v @ _H(P)  # the parts outside span(U), span(V)
    u_bad = tiny & _columns_beyond_roundoff(u_off, AV, P)
    v_bad = tiny & _columns_beyond_roundoff(v_off, AHU, P)
    if jnp.iscomplexobj(P):  # the phase of u_i relative to v_i: i Im(P_ii) / s_i
        u_inner = u_inner + _diag(1j * jnp.imag(p) * s_inv)
        u_bad = u_bad | (tiny & _columns_beyond_roundoff(jnp.imag(p)[..., None, :], P))
    u_dot = u @ u_inner + u_off * s_inv[..., None, :]
    v_dot = v @ v_inner + v_off * s_inv[..., None, :]
    u_dot = _nan_where(moved | u_bad[..., None, :], u_dot)
    v_dot = _nan_where(moved | v_bad[..., None, :], v_dot)
    return u_dot, jnp.real(p), v_dot


def _svd_cotangent(u, s, v, u_bar, s_bar, v_bar):
    """A_bar for A = U diag(s) V^H (thin) from the cotangents of U, s, V (any may be zero).

    NaN (the whole A_bar of a matrix) where it is not determined by the cotangents (module
    docstring): a degenerate pair of s with J = U^H U_bar or K = V^H V_bar beyond roundoff
    there, or a tiny s_i whose 1/s_i terms exist (A not square, or complex) while triplet i has
    a cotangent (s_bar_i, or u_bar_i / v_bar_i where that side has a 1/s_i term).
    """
    inner = jnp.zeros(s.shape + s.shape[-1:], u.dtype)
    out = jnp.zeros(u.shape[:-1] + v.shape[-2:-1], u.dtype)
    F, s_inv = _svd_weights(s)
    k = s.shape[-1]
    u_side, v_side = u.shape[-2] > k or jnp.iscomplexobj(u), v.shape[-2] > k  # where 1/s_i terms exist
    mixing, seen, given = [], [], []  # J, K; the cotangents a tiny s_i must not see; all of them
    if not _is_zero(s_bar):
        inner = inner + _diag(jnp.real(s_bar))
        given.append(jnp.real(s_bar)[..., None, :])
        seen += given[-1:] if u_side or v_side else []
    if not _is_zero(u_bar):
        J = _H(u) @ u_bar
        FJ = F * J
        inner = inner + (FJ + _H(FJ)) * s[..., None, :]
        if jnp.iscomplexobj(J):  # the phase of u_i: i Im(J_ii) / s_i
            inner = inner + _diag(1j * jnp.imag(jnp.diagonal(J, axis1=-2, axis2=-1)) * s_inv)
        out = out + ((u_bar - u @ J) * s_inv[..., None, :]) @ _H(v)
        mixing.append(J)
        given.append(u_bar)
        seen += [u_bar] if u_side else []
    if not _is_zero(v_bar):
        K = _H(v) @ v_bar
        FK = F * K
        inner = inner + s[..., :, None] * (FK + _H(FK))
        out = out + (u * s_inv[..., None, :]) @ _H(v_bar - v @ K)
        mixing.append(K)
        given.append(v_bar)
        seen += [v_bar] if v_side else []
    undetermined = _mixes_a_degenerate_block(s, *mixing) if mixing else jnp.zeros(s.shape[:-1], bool)
    for c in seen:  # empty where A is square and real: no 1/s_i terms
        undetermined = undetermined | jnp.any(_tiny(s) & _columns_beyond_roundoff(c, *given), axis=-1)
    return _nan_where(undetermined[..., None, None], _sandwich(u, inner, v) + out)


@primitive(examples=[(_M43,), (_M43.T.astype(np.float32),), (_M3Z[:2],)])
def svd(A: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The thin singular value decomposition A = u diag(s) vt (full_matrices=False).

    Why a rule: the singular vectors' phases follow one convention on every backend and
    the rule is the derivative of that function, also for complex A and losses that see
    the phases (module docstring). JAX's svd pullback divides by s_j^2 - s_i^2 and is NaN
    at repeated singular values; here degenerate pairs and (near-)zero singular values in
    the 1/s terms are dropped where the cotangent has no component there, so the cotangent
    is exact for the losses described in the module docstring (functions of s alone, or
    e.g. trace(u diag(g(s)) u^H)), and NaN where it has one, the derivative not being
    determined by it (sum(u diag(s) vt) at I, or at the rank-one [[2, 0], [0, 0], [0, 0]]:
    true gradient all ones). Forward mode likewise: NaN for the vectors whose tangent is
    not determined (module docstring).

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

    See also: `svdvals`, `eigh`, `rules.library.linalg_matfun.svd_matrix_function`, `rules.library.linalg.pinv`.
    """
    u, s, vt, _ = _svd(A)
    return u, s, vt


def _svd(A: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(u, s, vt, pivots): the thin svd of A in the phase convention (set by v = vt^H)."""
    u, s, vt = jnp.linalg.svd(A, full_matrices=False)
    v, d, k = _fix_phases(_H(vt))
    return u * d, s, _H(v), k


@svd.frule
def svd_frule(tangents, A):
    _, A_dot = tangents
    u, s, vt, k = _svd(A)
    v = _H(vt)

    def svd_pushforward(A_dot):
        u_dot, s_dot, v_dot = _svd_tangent(u, s, v, A_dot)
        v_dot, u_dot = _with_phase_turn(v, k, v_dot, (u, u_dot))
        return u_dot, s_dot, _H(v_dot)

    return (u, s, vt), _pushed(svd_pushforward, A_dot)


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


@svdvals.frule
def svdvals_frule(tangents, A):
    _, A_dot = tangents
    u, s, vt = jnp.linalg.svd(A, full_matrices=False)

    def svdvals_pushforward(A_dot):  # Re u_i^H A_dot v_i
        return _diag_sandwich(u, A_dot, _H(vt))

    return s, _pushed(svdvals_pushforward, A_dot)


@svdvals.rrule
def svdvals_rrule(A):
    project_A = ProjectTo(A)
    u, s, vt = jnp.linalg.svd(A, full_matrices=False)

    def svdvals_pullback(s_bar):
        return NoTangent(), project_A(_sandwich(u, _diag(jnp.real(unthunk(s_bar))), _H(vt)))

    return s, svdvals_pullback
