"""rules.library.linalg: every rule verified by the testers, and what it does better than JAX."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rules.library import linalg as la


def _cofactor_adjugate(A):
    """adj(A) by cofactors (the definition), in NumPy."""
    A = np.asarray(A)
    n = A.shape[0]
    adj = np.zeros_like(A)
    for i in range(n):
        for j in range(n):
            minor = np.delete(np.delete(A, i, axis=0), j, axis=1)
            adj[j, i] = (-1) ** (i + j) * np.linalg.det(minor)
    return adj


def test_the_module_ships_its_rules(shipped):
    assert shipped("linalg") == set(la.__all__)


# ----- forward mode: jax.jvp runs the frule, jax.grad the rrule ---------------------------------
_B = np.stack([la._M3Z, la._M3Z.T + 0.3 * np.eye(3)])  # a batch of two complex matrices


@pytest.mark.parametrize("f, args, static, options", [  # inputs beyond the examples: batches, dtypes
    (la.norm, (la._M43.T.astype(np.complex64) + 0.2j,), ("nuc",), {}),
    (la.normalize, (la._M43.astype(np.float32),), (), dict(axis=0)),
    (la.det, (_B,), (), dict(full=True)),
    (la.slogdet, (np.stack([la._M3, -la._M3.T]).astype(np.float32),), (), {}),
    (la.logdet, (la._M3Z.T,), (), {}),
    (la.inv, (_B.astype(np.complex64),), (), {}),
    (la.pinv, (la._M43.T + 0.5j * la._M43.T[::-1],), (), {}),
], ids=["norm-nuc-complex64", "normalize-axis-float32", "det-batch-complex", "slogdet-batch-float32",
        "logdet-complex", "inv-batch-complex64", "pinv-wide-complex"])
def test_jax_jvp_runs_the_frule_and_jax_grad_the_rrule(f, args, static, options, check_forward_mode):
    check_forward_mode(f, *args, static=static, **options)


# ----- value added: where plain JAX is NaN, wrong, or does more work ---------------------------
@pytest.mark.parametrize("ord, x", [(None, jnp.zeros(3)), (3, jnp.zeros(3)), ("fro", jnp.zeros((2, 2)))])
def test_norm_has_a_zero_subgradient_at_zero_where_jax_is_nan(ord, x):
    assert np.isnan(jax.grad(lambda x: jnp.linalg.norm(x, ord))(x)).all()
    np.testing.assert_array_equal(jax.grad(lambda x: la.norm(x, ord))(x), np.zeros(x.shape))


def test_norm_and_normalize_forward_mode_is_finite_at_zero_where_jax_is_nan():
    x, x_dot = jnp.zeros(3), jnp.array([1.0, -2.0, 0.5])
    assert np.isnan(jax.jvp(jnp.linalg.norm, (x,), (x_dot,))[1])
    assert float(jax.jvp(la.norm, (x,), (x_dot,))[1]) == 0.0
    np.testing.assert_array_equal(jax.jvp(la.normalize, (x,), (x_dot,))[1], np.zeros(3))


def test_normalize_is_finite_at_zero_where_jax_is_nan():
    x, w = jnp.zeros(3), jnp.array([1.0, -2.0, 0.5])
    assert np.isnan(jax.grad(lambda x: w @ (x / jnp.linalg.norm(x)))(x)).all()
    np.testing.assert_array_equal(la.normalize(x), np.zeros(3))
    np.testing.assert_array_equal(jax.grad(lambda x: w @ la.normalize(x))(x), np.zeros(3))
    x = jnp.array([0.3, -1.0, 2.0])  # and agrees with JAX away from 0
    np.testing.assert_allclose(jax.grad(lambda x: w @ la.normalize(x))(x),
                               jax.grad(lambda x: w @ (x / jnp.linalg.norm(x)))(x), rtol=1e-12)


@pytest.mark.parametrize("A", [
    np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]]),  # rank 2: rank-one adjugate
    np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 2.0]]),  # rank 2, zero pivot inside
    np.outer([1.0, 2.0, -1.0], [0.5, 1.0, 3.0]),  # rank 1: adjugate 0
])
def test_det_gradient_is_the_adjugate_at_singular_matrices(A):
    expected = _cofactor_adjugate(A).T
    np.testing.assert_allclose(jax.grad(la.det)(A), expected, atol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.grad(la.det))(A), expected, atol=1e-12)
    A_dot = np.array([[0.3, -1.0, 0.2], [0.5, 0.1, -0.7], [1.1, 0.4, 0.6]])  # forward: tr(adj(A) A_dot)
    np.testing.assert_allclose(jax.jvp(la.det, (A,), (A_dot,))[1], np.sum(expected * A_dot), atol=1e-12)
    # (JAX's own det rule is right at these in jax 0.10; jax 0.12's gives 0 at [1, 0] of the
    # second, where the adjugate has -2: this rule does not depend on which JAX runs it)


def _svd_as_one_sided_jacobi(svd, nullspace):
    """`jnp.linalg.svd` as a GPU's one-sided Jacobi SVD returns it: U's columns for zero singular
    values are (A V)_i / s_i, i.e. zero vectors (or, at the noise floor, garbage)."""

    def jacobi_svd(A, *args, **kwargs):
        u, s, vh = svd(A, *args, **kwargs)
        null = (s <= 1e-12 * s[..., :1])[..., None, :]
        fill = jnp.zeros_like(u) if nullspace == "zero" else 0.5 * u[..., :, :1] + 0.1  # not orthogonal
        return jnp.where(null, fill, u), s, vh

    return jacobi_svd


@pytest.mark.parametrize("nullspace", ["zero", "garbage"])
@pytest.mark.parametrize("A", [
    np.array([[1.0, 2.0], [2.0, 4.0]]),  # rank 1 of 2: the adjugate [[4, -2], [-2, 1]]
    np.array([[2.0, 1.0, 0.0], [1.0, 1.0, 1.0], [3.0, 2.0, 1.0]]),  # rank 2: cofactors -1, 2, -2
    np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 2.0]]),  # rank 2, zero pivot inside
    np.outer([1.0, 2.0, -1.0], [0.5, 1.0, 3.0]),  # rank 1 of 3: adjugate 0
])
def test_det_gradient_is_the_adjugate_whatever_the_svd_returns_for_zero_singular_values(monkeypatch, A, nullspace):
    # on a GPU (one-sided Jacobi SVD) U's null vector came back as 0 and det's gradient was 0
    monkeypatch.setattr(jnp.linalg, "svd", _svd_as_one_sided_jacobi(jnp.linalg.svd, nullspace))
    expected = _cofactor_adjugate(A).T
    np.testing.assert_allclose(jax.grad(la.det)(A), expected, atol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.grad(la.det))(A), expected, atol=1e-12)


@pytest.mark.parametrize("A", [
    np.array([[1.0, 2.0], [2.0, 4.0 + 1e-9]]),
    np.array([[2.0, 1.0, 0.0], [1.0, 1.0, 1.0], [3.0, 2.0, 1.0 + 1e-7]]),
    np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0 - 1e-8], [1.0, 0.0, 1.0]]) + 0.3j * np.eye(3)[::-1],
])
def test_det_gradient_is_the_adjugate_near_singular_matrices(A):
    (got,) = jax.vjp(la.det, A)[1](jnp.ones((), A.dtype))  # JAX's convention: adj(A)^T, unconjugated
    np.testing.assert_allclose(got, _cofactor_adjugate(A).T, rtol=1e-7, atol=1e-12)


def test_slogdet_factorises_once_where_jax_factorises_twice(count_equations):
    A = jnp.asarray(la._M3)
    plain = jax.make_jaxpr(jax.grad(lambda A: jnp.linalg.slogdet(A)[1]))(A)
    ours = jax.make_jaxpr(jax.grad(lambda A: la.slogdet(A)[1]))(A)
    assert (count_equations(plain.jaxpr, "lu"), count_equations(ours.jaxpr, "lu")) == (2, 1)
    np.testing.assert_allclose(jax.grad(lambda A: la.slogdet(A)[1])(A),
                               jax.grad(lambda A: jnp.linalg.slogdet(A)[1])(A), rtol=1e-12)


# ----- documented behaviour -------------------------------------------------------------------
def test_norm_max_ties_share_the_seed_and_inf_is_written_as_a_string():
    x = jnp.array([1.0, -1.0, 0.5])
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: la.norm(x, "inf")))(x), [0.5, -0.5, 0.0])
    assert float(la.norm(x, np.inf)) == 1.0  # eagerly a float ord is fine
    with pytest.raises(TypeError, match="ord='inf'"):  # traced: a Python float is an array to JAX
        jax.jit(lambda x: la.norm(x, np.inf))(x)


def test_norm_nuclear_subgradient_drops_zero_singular_values():
    A = jnp.array([[2.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(jax.grad(lambda A: la.norm(A, "nuc"))(A), [[1.0, 0.0], [0.0, 0.0]])


def test_slogdet_sign_gets_no_cotangent_for_real_and_the_exact_one_for_complex():
    A = jnp.asarray(la._M3)
    np.testing.assert_array_equal(jax.grad(lambda A: la.slogdet(A)[0])(A), np.zeros((3, 3)))
    Z, c = jnp.asarray(la._M3Z), 0.7 - 0.4j

    def loss(slogdet):
        return lambda Z: jnp.real(c * slogdet(Z)[0]) + slogdet(Z)[1]

    np.testing.assert_allclose(jax.grad(loss(la.slogdet))(Z), jax.grad(loss(jnp.linalg.slogdet))(Z), rtol=1e-10)


def test_logdet_and_inv_agree_with_jax_where_jax_is_right():
    A = jnp.asarray(la._SPD3)
    np.testing.assert_allclose(jax.grad(la.logdet)(A), jax.grad(lambda A: jnp.linalg.slogdet(A)[1])(A), rtol=1e-12)
    G = jnp.arange(9.0).reshape(3, 3)
    np.testing.assert_allclose(jax.grad(lambda A: jnp.sum(G * la.inv(A)))(A),
                               jax.grad(lambda A: jnp.sum(G * jnp.linalg.inv(A)))(A), rtol=1e-12)
