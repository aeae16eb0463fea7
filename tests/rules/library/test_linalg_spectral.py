"""rules.library.linalg_spectral: every rule verified by the testers, and what it does better."""

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest

from rules.library import linalg_spectral as sp
from rules.testing import rand_tangent, test_frule, test_rrule

# A symmetric matrix with a repeated eigenvalue (1, 1, 2), and the identity.
_Q = jnp.asarray(sp._Q3)
REPEATED = _Q @ jnp.diag(jnp.array([1.0, 1.0, 2.0])) @ _Q.T
G = jnp.array([[1.0, 2.0, -1.0], [0.5, 0.0, 3.0], [-2.0, 1.0, 1.5]])  # a non-symmetric seed


def test_the_module_ships_its_rules(shipped):
    assert shipped("linalg_spectral") == set(sp.__all__)


# ----- forward mode: jax.jvp runs the frule, jax.grad the rrule ---------------------------------
@pytest.mark.parametrize("f, args", [  # inputs beyond the examples: batches, dtypes
    (sp.eigh, (np.stack([sp._S3Z, sp._S3Z.conj()]).astype(np.complex64),)),
    (sp.eigvalsh, ((sp._S3 + 0.1 * G).astype(np.float32),)),
    (sp.svd, (sp._M43.T + 0.2j,)),
    (sp.svdvals, (sp._M43.T.astype(np.float32),)),
], ids=["eigh-batch-complex64", "eigvalsh-nonsymmetric-float32", "svd-wide-complex", "svdvals-wide-float32"])
def test_jax_jvp_runs_the_frule_and_jax_grad_the_rrule(f, args, check_forward_mode):
    check_forward_mode(f, *args)


# ----- value added: finite (and right) at repeated eigenvalues, where JAX is NaN ----------------
def _trace_of_exp(eigh):
    def loss(A):  # trace(V diag(exp(w)) V^T) = trace(expm(A)): invariant to rotations of V
        w, v = eigh(A)
        return jnp.trace(v @ jnp.diag(jnp.exp(w)) @ v.T)

    return loss


@pytest.mark.parametrize("A, exactly_equal", [(jnp.eye(3), True), (REPEATED, False)],
                         ids=["identity", "rotated-1-1-2"])
def test_eigh_is_right_in_reverse_mode_for_a_rotation_invariant_loss_at_a_repeated_eigenvalue(A, exactly_equal):
    """Where the eigenvalues are exactly equal (the identity), JAX divides by 0: NaN. Where
    rounding splits them by ~1e-16 (the rotated matrix), JAX divides rounding noise by
    rounding noise, and what comes out depends on the last bits of the arithmetic: NaN, a
    wrong gradient, or the right one by luck (all three seen on one CPU, with LLVM's
    optimization level changing which), so only the exact case is a contrast to assert."""
    expected = jsl.expm(A)  # d tr(expm(A)) = expm(A)^T
    A_dot = G + G.T  # forward mode too: d tr(expm(A)) [A_dot] = tr(expm(A) A_dot)
    if exactly_equal:
        assert not np.all(np.isfinite(jax.grad(_trace_of_exp(jnp.linalg.eigh))(A)))
        assert not np.isfinite(jax.jvp(_trace_of_exp(jnp.linalg.eigh), (A,), (A_dot,))[1])
    np.testing.assert_allclose(jax.grad(_trace_of_exp(sp.eigh))(A), expected, rtol=1e-12)
    # forward mode cannot know that the loss ignores the rotation inside the block: the tangent
    # of V there is not determined (NaN, not a guess); expm_sym (Daleckii-Krein) has the answer
    assert np.isnan(jax.jvp(_trace_of_exp(sp.eigh), (A,), (A_dot,))[1])
    np.testing.assert_allclose(jax.jvp(lambda A: jnp.trace(sp.expm_sym(A)), (A,), (A_dot,))[1],
                               np.sum(expected * A_dot), rtol=1e-12)


def test_eigh_with_an_eigenvalue_loss_skips_the_gaps_and_agrees_with_jax():
    loss = lambda eigh: lambda A: jnp.sum(eigh(A)[0] ** 2)  # noqa: E731
    ours = jax.jit(jax.grad(loss(sp.eigh)))(REPEATED)
    np.testing.assert_allclose(ours, 2 * REPEATED, rtol=1e-12)  # d tr(A^2) = 2 A
    np.testing.assert_allclose(ours, jax.grad(loss(jnp.linalg.eigh))(REPEATED), rtol=1e-12)
    np.testing.assert_allclose(jax.grad(lambda A: jnp.sum(sp.eigvalsh(A)))(REPEATED), np.eye(3), atol=1e-12)


def test_svd_is_finite_for_a_rotation_invariant_loss_at_repeated_singular_values():
    A = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])

    def loss(svd):  # trace(U diag(s^3) U^T) = sum(s^3)
        def trace(A):
            u, s, _ = svd(A)
            return jnp.trace(u @ jnp.diag(s**3) @ u.T)

        return trace

    assert np.isnan(jax.grad(loss(lambda A: jnp.linalg.svd(A, full_matrices=False)))(A)).all()
    np.testing.assert_allclose(jax.grad(loss(sp.svd))(A), 3 * A, atol=1e-12)
    np.testing.assert_allclose(jax.grad(lambda A: jnp.sum(sp.svdvals(A)))(A), A, atol=1e-12)


# ----- never finite but wrong: NaN where the derivative is not determined ------------------------
def _sum_of_reconstruction(name):
    def loss(A):  # sum(V diag(w) V^T) = sum(A) (eigh, symmetric A), sum(U diag(s) V^T) = sum(A) (svd)
        if name == "eigh":
            w, v = sp.eigh(A)
            return jnp.sum(v @ jnp.diag(w) @ v.T)
        if name == "jax-eigh":
            w, v = jnp.linalg.eigh(A)
            return jnp.sum(v @ jnp.diag(w) @ v.T)
        u, s, vt = sp.svd(A) if name == "svd" else jnp.linalg.svd(A, full_matrices=False)
        return jnp.sum((u * s[None, :]) @ vt)

    return loss


@pytest.mark.parametrize("name, A", [
    ("eigh", jnp.eye(3)),  # a triple eigenvalue
    ("svd", jnp.eye(3)),  # a triple singular value
    ("svd", jnp.array([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])),  # rank 1, tall: a zero singular value
], ids=["eigh-identity", "svd-identity", "svd-rank-one-tall"])
def test_a_loss_through_the_vectors_of_a_degenerate_spectrum_gets_nan_not_a_wrong_gradient(name, A):
    # the loss is sum(A): true gradient all ones. The cotangent at the point cannot tell it from a
    # loss whose gradient differs (e.g. a projector's), so the rule says NaN; it used to drop the
    # degenerate terms and return the identity (eigh, svd at I) or 0 at [2, 1] (the rank-one case)
    true = np.ones(A.shape)
    plain = jax.grad(_sum_of_reconstruction("jax-" + name))(A)
    assert np.isnan(plain).all()  # plain JAX: NaN too (1/0 and 0/0)
    ours = jax.grad(_sum_of_reconstruction(name))(A)
    assert np.isnan(ours).all()
    assert np.isnan(jax.jit(jax.grad(_sum_of_reconstruction(name)))(A)).all()
    A_dot = jnp.ones(A.shape)  # forward mode: the vectors' tangents are NaN in the block
    assert np.isnan(jax.jvp(_sum_of_reconstruction(name), (A,), (A_dot,))[1])
    if name == "eigh":  # a spectral function: sym_matrix_function takes the limit (Daleckii-Krein)
        identity = lambda w: w  # noqa: E731
        np.testing.assert_allclose(jax.grad(lambda A: jnp.sum(sp.sym_matrix_function(A, identity)))(A), true,
                                   rtol=1e-12)
        np.testing.assert_allclose(jax.jvp(lambda A: jnp.sum(sp.sym_matrix_function(A, identity)), (A,), (A_dot,))[1],
                                   np.sum(true * A_dot), rtol=1e-12)


def test_eigh_keeps_the_exact_gradient_of_an_eigenvector_with_a_gap_beside_a_degenerate_block():
    D, g = jnp.diag(jnp.array([1.0, 1.0, 2.0])), jnp.array([0.3, -1.0, 2.0])
    loss = lambda eigh: lambda A: g @ eigh(A)[1][:, 2]  # noqa: E731  (v_3: eigenvalue 2, simple)
    assert np.isnan(jax.grad(loss(jnp.linalg.eigh))(D)).all()  # plain JAX: 0 * (1/0) in the block
    # d v_3 = (I - v_3 v_3^T) dA v_3 / (2 - 1), v_3 = e_3: A_bar = herm((I - e_3 e_3^T) g e_3^T)
    true = np.array([[0.0, 0.0, 0.15], [0.0, 0.0, -0.5], [0.15, -0.5, 0.0]])
    np.testing.assert_allclose(jax.grad(loss(sp.eigh))(D), true, atol=1e-15)
    A_dot = jnp.array([[0.5, 1.0, -2.0], [1.0, 0.0, 0.7], [-2.0, 0.7, 0.3]])  # forward: v_3's tangent is finite,
    _, v_dot = jax.jvp(sp.eigh, (D,), (A_dot,))[1]  # the block's is not determined (A_dot mixes it)
    np.testing.assert_allclose(v_dot[:, 2], [-2.0, 0.7, 0.0], atol=1e-15)
    assert np.isnan(v_dot[:, :2]).all()


def test_svd_tangent_of_a_zero_singular_values_vector_is_nan_and_the_rest_finite():
    A = jnp.array([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    A_dot = jnp.array([[0.5, 1.0], [-1.0, 0.3], [0.2, 0.7]])
    u_dot, s_dot, vt_dot = jax.jvp(sp.svd, (A,), (A_dot,))[1]
    # u_2 of s_2 = 0 moves by (I - U U^T) A_dot v_2 / s_2 = (0, 0, 0.7) / 0: not determined
    assert np.isnan(u_dot[:, 1]).all()
    np.testing.assert_allclose(s_dot, [0.5, 0.3], atol=1e-15)  # s_dot = diag(U^T A_dot V)
    # u_1 = e_1 moves by (A_dot v_1 - u_1 (u_1^T A_dot v_1)) / s_1 + the pair term: (0, -0.5, 0.1)
    np.testing.assert_allclose(u_dot[:, 0], [0.0, -0.5, 0.1], atol=1e-15)


# ----- documented behaviour -------------------------------------------------------------------
def test_complex_eigh_and_svd_agree_with_jax_on_gauge_invariant_losses():
    Z, M = jnp.asarray(sp._S3Z), jnp.asarray(sp._M43) + 0.2j

    def eigh_loss(eigh):  # V diag(sin w) V^H does not depend on the eigenvectors' phases
        def loss(A):
            w, v = eigh(A)
            return jnp.sum(jnp.abs(v @ jnp.diag(jnp.sin(w)) @ v.conj().T + 0.3j) ** 2)

        return loss

    def svd_loss(svd):  # U diag(s^2) V^H likewise
        def loss(A):
            u, s, vt = svd(A)
            return jnp.sum(jnp.abs(u @ jnp.diag(s**2) @ vt + 0.3j) ** 2)

        return loss

    herm = lambda A: jnp.linalg.eigh((A + A.conj().T) / 2)  # noqa: E731
    np.testing.assert_allclose(jax.grad(eigh_loss(sp.eigh))(Z), jax.grad(eigh_loss(herm))(Z), atol=1e-12)
    thin = lambda A: jnp.linalg.svd(A, full_matrices=False)  # noqa: E731
    for A in (M, M.T):  # tall and wide: the (I - U U^H) terms
        np.testing.assert_allclose(jax.grad(svd_loss(sp.svd))(A), jax.grad(svd_loss(thin))(A), atol=1e-12)


# ----- one function on every backend: the phase convention --------------------------------------
TIE = jnp.array([[2.0, 1.0], [1.0, 2.0]])  # vectors (1, +-1) / sqrt(2): the largest entries tie


def _pivot_entries(v):
    """Each column's first entry within a relative sqrt(eps) of its largest magnitude (NumPy)."""
    mag = np.abs(v)
    k = np.argmax(mag >= (1 - np.sqrt(np.finfo(mag.dtype).eps)) * mag.max(axis=0), axis=0)
    return v[k, np.arange(v.shape[1])]


@pytest.mark.parametrize("A", [sp._M43, sp._M43.T.astype(np.float32), sp._M3Z, sp._M3Z[:2], TIE],
                         ids=["tall", "wide-f32", "complex", "complex-wide", "tie"])
def test_svd_and_eigh_vectors_have_a_real_positive_pivot_entry(A):
    u, s, vt = sp.svd(A)
    np.testing.assert_allclose((u * s[None, :]) @ vt, A, rtol=1e-5, atol=1e-5)
    n = min(A.shape)
    H = np.asarray(A)[:n, :n]
    for v in (np.asarray(vt).conj().T, np.asarray(sp.eigh(H)[1])):
        pivots = _pivot_entries(v)
        assert (pivots.real > 0).all()
        np.testing.assert_allclose(pivots.imag, 0, atol=1e-6 if v.dtype == np.complex64 else 1e-15)


def _as_another_backend(decomposition, name):
    """`jnp.linalg.svd` / `jnp.linalg.eigh` as another backend returns them: other signs (phases)
    for the vectors (pairs) and other rounding (a few ulps) of their entries."""

    def other(A, *args, **kwargs):
        out = decomposition(A, *args, **kwargs)
        if not kwargs.get("compute_uv", True):
            return out
        vecs = out[2].conj().swapaxes(-1, -2) if name == "svd" else out[1]  # v = vt^H, or v
        m, n = vecs.shape[-2:]
        turn = np.exp(1j * np.array([[2.0, -0.7, 3.1]])) if jnp.iscomplexobj(vecs) else np.array([[-1.0, 1.0, -1.0]])
        turn = turn[:, :n]
        ulps = 1 + 4 * np.finfo(vecs.dtype).eps * np.linspace(-1.0, 1.0, m)[:, None]  # ties go to the end
        vecs = (vecs * ulps * turn).astype(vecs.dtype)
        if name == "svd":
            return (out[0] * turn).astype(out[0].dtype), out[1], vecs.conj().swapaxes(-1, -2)
        return out[0], vecs

    return other


def _phase_dependent_loss(name, A):
    """A loss that sees every vector's sign (phase): so do its gradient and its value."""
    rng = np.random.default_rng(3)
    out = getattr(sp, name)(A)
    seeds = [rng.normal(size=np.shape(y)) + 1j * rng.normal(size=np.shape(y)) for y in out]
    return lambda A: sum(jnp.sum(jnp.real(g * y)) for g, y in zip(seeds, getattr(sp, name)(A)))


@pytest.mark.parametrize("name, A", [
    ("svd", sp._M43), ("svd", sp._M3Z[:2]), ("svd", TIE), ("eigh", sp._S3), ("eigh", sp._S3Z), ("eigh", TIE),
], ids=["svd-tall", "svd-complex-wide", "svd-tie", "eigh", "eigh-complex", "eigh-tie"])
def test_svd_and_eigh_are_the_same_function_whatever_signs_the_backend_chooses(monkeypatch, name, A):
    # backends choose other signs (LAPACK, cuSOLVER's Jacobi, batched or not): svd failed test_rrule on a GPU
    loss, A_dot = _phase_dependent_loss(name, A), rand_tangent(np.asarray(A), seed=5)
    expected_y, expected_g = getattr(sp, name)(A), jax.grad(loss)(A)
    expected_t = jax.jvp(loss, (A,), (A_dot,))[1]  # forward mode: the frule
    monkeypatch.setattr(jnp.linalg, name, _as_another_backend(getattr(jnp.linalg, name), name))
    for y, want in zip(getattr(sp, name)(A), expected_y):
        np.testing.assert_allclose(y, want, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(jax.grad(loss)(A), expected_g, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(A), expected_g, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(jax.jvp(loss, (A,), (A_dot,))[1], expected_t, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name, A", [
    ("svd", sp._M43[:3]),
    ("svd", (sp._M43 + 0.5j * sp._M43[::-1]).astype(np.complex64)),
    ("eigh", sp._M3Z.astype(np.complex64)),
], ids=["svd-square", "svd-tall-complex64", "eigh-complex64"])
def test_svd_and_eigh_pass_the_testers_beyond_their_examples(name, A):
    assert test_rrule(getattr(sp, name), A).max_error < 1e-5
    assert test_frule(getattr(sp, name), A).max_error < 1e-5
