"""rules.library.linalg_matfun: every rule verified by the testers, and what it does better."""

import functools

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest

from rules.library import linalg_matfun as mf
from rules.library import linalg_spectral as sp
from rules import NoTangent
from rules.testing import test_frule, test_rrule, with_tangent

# A symmetric matrix with a repeated eigenvalue (1, 1, 2), and the identity.
_Q = jnp.asarray(sp._Q3)
REPEATED = _Q @ jnp.diag(jnp.array([1.0, 1.0, 2.0])) @ _Q.T
G = jnp.array([[1.0, 2.0, -1.0], [0.5, 0.0, 3.0], [-2.0, 1.0, 1.5]])  # a non-symmetric seed


def test_the_module_ships_its_rules(shipped):
    assert shipped("linalg_matfun") == set(mf.__all__)


def test_the_functions_are_still_importable_from_linalg_spectral():
    moved = ("sym_matrix_function", "sqrtm_psd", "expm_sym", "logm_spd")  # they lived there (svd_matrix_function never did)
    assert all(getattr(sp, name) is getattr(mf, name) for name in moved)


# ----- forward mode: jax.jvp runs the frule, jax.grad the rrule ---------------------------------
@pytest.mark.parametrize("f, args, static, options", [  # inputs beyond the examples: batches, dtypes
    (mf.sym_matrix_function, (sp._S3Z.astype(np.complex64),), (jnp.sin,), {}),
    (mf.sqrtm_psd, (np.stack([mf._S3, np.eye(3)]).astype(np.float32),), (), dict(full=True)),
    (mf.expm_sym, (sp._S3Z - 1.0,), (), {}),
    (mf.logm_spd, ((mf._S3 + 0.1 * G).astype(np.float32),), (), {}),
], ids=["sym_matrix_function-complex64", "sqrtm_psd-batch-float32", "expm_sym-complex", "logm_spd-float32"])
def test_jax_jvp_runs_the_frule_and_jax_grad_the_rrule(f, args, static, options, check_forward_mode):
    check_forward_mode(f, *args, static=static, **options)


# ----- value added: finite (and right) at repeated eigenvalues, where JAX is NaN ----------------
@pytest.mark.parametrize("name, plain_f, df_at_1", [
    ("sqrtm_psd", jnp.sqrt, 0.5), ("expm_sym", jnp.exp, np.e), ("logm_spd", jnp.log, 1.0),
])
def test_matrix_functions_are_finite_and_exact_at_the_identity_in_both_modes_where_eigh_code_is_nan(name, plain_f, df_at_1):
    def via_jax_eigh(A):
        w, v = jnp.linalg.eigh(A)
        return v @ jnp.diag(plain_f(w)) @ v.T

    I = jnp.eye(3)
    assert np.isnan(jax.grad(lambda A: jnp.sum(G * via_jax_eigh(A)))(I)).all()
    ours = jax.grad(lambda A: jnp.sum(G * getattr(mf, name)(A)))(I)
    np.testing.assert_allclose(ours, df_at_1 * (G + G.T) / 2, rtol=1e-12)  # f'(1) herm(G)
    assert np.isnan(jax.jvp(via_jax_eigh, (I,), (G,))[1]).all()  # forward mode: the same map
    np.testing.assert_allclose(jax.jvp(getattr(mf, name), (I,), (G,))[1], df_at_1 * (G + G.T) / 2, rtol=1e-12)


def test_expm_sym_agrees_with_jax_pade_expm_at_a_repeated_eigenvalue():
    ours = jax.grad(lambda A: jnp.sum(G * mf.expm_sym(A)))(REPEATED)
    pade = jax.grad(lambda A: jnp.sum(G * jsl.expm((A + A.T) / 2)))(REPEATED)
    np.testing.assert_allclose(ours, pade, rtol=1e-10)


def test_sqrtm_and_logm_invert_their_inverses_through_the_rules_at_a_repeated_eigenvalue():
    # d <G, S(A) S(A)> = d <G, A>  and  d <G, expm(logm(A))> = d <G, A>: both herm(G)
    for compose in (lambda A: mf.sqrtm_psd(A) @ mf.sqrtm_psd(A), lambda A: mf.expm_sym(mf.logm_spd(A))):
        g = jax.jit(jax.grad(lambda A: jnp.sum(G * compose(A))))(REPEATED)
        np.testing.assert_allclose(g, (G + G.T) / 2, rtol=1e-9, atol=1e-12)


def _cubic(w):
    return w**3 - 2 * w


def _cubic_by_products(A):  # the same matrix function in plain JAX: exact derivatives of all orders
    H = (A + jnp.conj(A.swapaxes(-1, -2))) / 2
    return H @ H @ H - 2 * H


_SECOND = {"fwd-rev": jax.hessian, "rev-rev": lambda f: jax.jacrev(jax.grad(f)),
           "fwd-fwd": lambda f: jax.jacfwd(jax.jacfwd(f)), "jit-vmap": lambda f: lambda A: jax.jit(jax.vmap(jax.hessian(f)))(A[None])[0]}
_NEAR = jnp.eye(3) + 1e-6 * (G + G.T)  # eigenvalues 1e-6 apart


_POINTS = {"I": jnp.eye(3), "0": jnp.zeros((3, 3)), "repeated": REPEATED, "near": _NEAR, "distinct": jnp.asarray(mf._S3)}
_CASES = [("I", mode) for mode in _SECOND] + [(point, "fwd-rev") for point in list(_POINTS)[1:]]  # every mode once


# plain JAX's Hessians of the two losses (Pade's expm, the cubic by products), compiled once for
# every point and mode: the mode is what is tested of ours (op by op, each mode compiled Pade's
# derivatives anew: 2-4 s each)
_PLAIN_HESSIANS = tuple(jax.jit(jax.hessian(f)) for f in (lambda A: jnp.sum(G * jsl.expm((A + A.T) / 2)),
                                                          lambda A: jnp.sum(G * _cubic_by_products(A))))


@pytest.mark.parametrize("point, mode", _CASES, ids=[f"{p}-{m}" for p, m in _CASES])
def test_matrix_functions_second_derivatives_are_exact_at_repeated_eigenvalues(point, mode):
    A, second = _POINTS[point], _SECOND[mode]
    # through eigh they were NaN at every repeated eigenvalue (jax.hessian of expm_sym at 0 too)
    by_pade, by_products = (hessian(A) for hessian in _PLAIN_HESSIANS)
    np.testing.assert_allclose(second(lambda A: jnp.sum(G * mf.expm_sym(A)))(A), by_pade, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(second(lambda A: jnp.sum(G * mf.sym_matrix_function(A, _cubic)))(A), by_products,
                               rtol=1e-9, atol=1e-10)


def test_matrix_functions_second_derivatives_compose_to_those_of_the_identity_map():
    # expm(logm(A)) = sqrtm(A)^2 = A: their second derivatives are 0, also at a repeated eigenvalue
    for compose in (lambda A: mf.sqrtm_psd(A) @ mf.sqrtm_psd(A), lambda A: mf.expm_sym(mf.logm_spd(A))):
        for A in (jnp.eye(3), REPEATED):
            np.testing.assert_allclose(jax.hessian(lambda A: jnp.sum(G * compose(A)))(A), 0, atol=1e-9)


def test_matrix_functions_second_derivatives_of_complex_hermitian_and_float32_matrices():
    rng = np.random.default_rng(6)
    A_dot, B_dot = rng.normal(size=(2, 3, 3)) + 1j * rng.normal(size=(2, 3, 3))
    A = _Q @ jnp.diag(jnp.array([1.0, 1.0, 2.0])) @ _Q.T + 0j  # repeated eigenvalue, complex dtype
    A = A + 1e-1j * (jnp.eye(3, k=1) - jnp.eye(3, k=-1))
    for f, plain in ((lambda A: mf.sym_matrix_function(A, _cubic)), _cubic_by_products), \
                    ((lambda A: mf.expm_sym(A)), lambda A: jsl.expm((A + jnp.conj(A.T)) / 2)):
        second = jax.jit(lambda f: jax.jvp(lambda B: jax.jvp(f, (B,), (A_dot,))[1], (A,), (B_dot,))[1],
                         static_argnums=0)  # compiled: op by op is slow
        np.testing.assert_allclose(second(f), second(plain), rtol=1e-9, atol=1e-12)
    I32 = jnp.eye(3, dtype=jnp.float32)
    np.testing.assert_allclose(jax.jit(jax.hessian(lambda A: jnp.sum(G * mf.expm_sym(A))))(I32),
                               jax.jit(jax.hessian(lambda A: jnp.sum(G * jsl.expm((A + A.T) / 2))))(I32),
                               rtol=1e-5, atol=1e-5)


def test_matrix_functions_third_derivatives_raise_rather_than_differentiate_eigh():
    for third in (jax.jacfwd(jax.hessian(lambda A: jnp.sum(G * mf.expm_sym(A)))),
                  jax.jacrev(jax.jacrev(jax.grad(lambda A: jnp.sum(G * mf.logm_spd(A))))),
                  jax.jacfwd(jax.hessian(lambda A: jnp.sum(G * mf.svd_matrix_function(A, jnp.sin))))):
        with pytest.raises(NotImplementedError, match="order three and higher.*jax.scipy.linalg.expm"):
            third(REPEATED)


# ----- documented behaviour -------------------------------------------------------------------
def test_sym_matrix_function_takes_the_limit_that_masked_eigh_drops():
    # sum(V f(W) V^T) at I: the exact gradient is f'(1) * ones; through eigh the eigenvector
    # cotangent meets the degenerate block, where no rule can recover the limit: NaN, not a
    # finite wrong number (it was f'(1) * eye, the pairs dropped). sym_matrix_function has it.
    def via_eigh(A):
        w, v = sp.eigh(A)
        return jnp.sum(v @ jnp.diag(jnp.exp(w)) @ v.T)

    I = jnp.eye(3)
    assert np.isnan(jax.grad(via_eigh)(I)).all()
    np.testing.assert_allclose(jax.grad(lambda A: jnp.sum(mf.sym_matrix_function(A, jnp.exp)))(I),
                               np.e * np.ones((3, 3)), rtol=1e-12)


def test_sym_matrix_function_derives_df_by_forward_mode_or_takes_it_given():
    A = jnp.asarray(mf._S3) + 0.1 * G  # a non-symmetric input: its symmetric part is used
    auto = jax.grad(lambda A: jnp.sum(G * mf.sym_matrix_function(A, jnp.tanh)))(A)
    given = jax.grad(lambda A: jnp.sum(G * mf.sym_matrix_function(A, jnp.tanh, df=lambda w: 1 - jnp.tanh(w) ** 2)))(A)
    np.testing.assert_allclose(auto, given, rtol=1e-12)
    np.testing.assert_allclose(auto, auto.T, rtol=1e-12)  # the cotangent is symmetric


# ----- svd_matrix_function: the singular values' side -----------------------------------------
def test_svd_matrix_function_is_determined_where_svd_is_not():
    # sum(U diag(s) V^T) = sum(A): the gradient is all ones, at I (repeated singular values) and
    # at the rank-one 3x2 [[2, 0], [0, 0], [0, 0]] (a zero singular value), where the loss
    # through svd gets NaN (JAX's svd, and the library's: not determined by its cotangent)
    for A in (jnp.eye(3), jnp.array([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])):
        ours = jax.grad(lambda A: jnp.sum(mf.svd_matrix_function(A, mf._identity)))(A)
        np.testing.assert_allclose(ours, np.ones(A.shape), rtol=1e-12)

        def via_svd(A):
            u, s, vt = sp.svd(A)
            return jnp.sum((u * s[..., None, :]) @ vt)

        assert np.isnan(jax.grad(via_svd)(A)).any()
    # a function with a skew part: tanh at I, the loss <C, g(A)> with C not symmetric:
    # D1 = tanh'(1) on sym(C), D2 = tanh(1) on skew(C)
    C = jnp.array([[1.0, 2.0], [0.0, -1.0]])
    got = jax.grad(lambda A: jnp.sum(C * mf.svd_matrix_function(A, jnp.tanh)))(jnp.eye(2))
    sym, skew = (C + C.T) / 2, (C - C.T) / 2
    np.testing.assert_allclose(got, (1 - np.tanh(1.0) ** 2) * sym + np.tanh(1.0) * skew, rtol=1e-12)


@pytest.mark.parametrize("shape", [(4, 3), (3, 4), (3, 3)], ids=["tall", "wide", "square"])
def test_svd_matrix_function_agrees_with_autodiff_through_svd_at_distinct_singular_values(shape):
    A = jnp.asarray(np.random.default_rng(3).normal(size=shape))
    C = jnp.arange(np.prod(shape), dtype=float).reshape(shape) - 4

    def via_svd(A):
        u, s, vt = jnp.linalg.svd(A, full_matrices=False)
        return jnp.sum(C * ((u * jnp.sin(s)[None, :]) @ vt))

    ours = jax.grad(lambda A: jnp.sum(C * mf.svd_matrix_function(A, jnp.sin)))(A)
    np.testing.assert_allclose(ours, jax.grad(via_svd)(A), rtol=1e-10, atol=1e-12)
    test_rrule(mf.svd_matrix_function, np.asarray(A), with_tangent(jnp.sin, NoTangent()))
    test_frule(mf.svd_matrix_function, np.asarray(A), with_tangent(jnp.sin, NoTangent()))
    with pytest.raises(TypeError, match="svd_matrix_function.*complex"):
        mf.svd_matrix_function(A + 1j, jnp.sin)


def _odd_cubic(s):
    return s**3 + 2 * s


def _svd_cubic_loss(A, W, R, plain=False):  # f(s) = s^3 + 2 s: U f(S) V^T = A A^T A + 2 A at every A
    g = A @ A.T @ A + 2 * A if plain else mf.svd_matrix_function(A, _odd_cubic)
    return jnp.sum(W * g) + jnp.sum(R * g**2) / 2


_SVD_SECOND = {  # Hessians in A, compiled once per shape
    "fwd-rev": jax.jit(jax.hessian(_svd_cubic_loss), static_argnums=3),
    "rev-rev": jax.jit(jax.jacrev(jax.grad(_svd_cubic_loss)), static_argnums=3),
    "jit-vmap": jax.jit(lambda A, W, R: jax.vmap(jax.hessian(_svd_cubic_loss), (0, None, None))(A[None], W, R)[0]),
}


@pytest.mark.parametrize("A", [np.eye(3), np.diag([1.0, 2.0, 2.0]), np.diag([1.0, 2.0, 0.0]), np.ones((4, 3))],
                         ids=["I", "repeated", "rank-deficient", "tall-rank-1"])
def test_svd_matrix_function_second_derivatives_are_exact_at_tied_and_zero_singular_values(A):
    # through the SVD's frame they were NaN at tied singular values (the registered example I
    # among them), and through JAX's svd jvp finite and wrong (3e32 at ones((4, 3))); against
    # an odd polynomial f, for which the function is plain JAX
    rng = np.random.default_rng(9)
    A, W, R = (jnp.asarray(M) for M in (A, *rng.normal(size=(2, *A.shape))))
    want = _SVD_SECOND["fwd-rev"](A, W, R, True)
    for mode in ("fwd-rev", "rev-rev", "jit-vmap"):
        got = _SVD_SECOND[mode](A, W, R) if mode == "jit-vmap" else _SVD_SECOND[mode](A, W, R, False)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=mode)


def test_svd_matrix_function_second_derivatives_of_a_non_polynomial_f_at_ties():
    # sin at I (its registered example) and at a repeated singular value: against central
    # differences of the (verified) gradient; and ones((4, 3)) with f = identity: exactly 0
    rng = np.random.default_rng(8)
    W, E = jnp.asarray(rng.normal(size=(4, 3))), jnp.asarray(rng.normal(size=(4, 3)))
    loss = lambda A: jnp.sum(W * mf.svd_matrix_function(A, lambda s: s, jnp.ones_like))  # noqa: E731
    np.testing.assert_array_equal(jax.jit(jax.hessian(loss))(jnp.ones((4, 3))), 0.0)

    @functools.partial(jax.jit, static_argnums=0)
    def second(f, A):  # <E, hessian(f)(A) E> by forward over reverse, and its central difference
        g, E_ = jax.grad(f), E[: A.shape[0]]
        return jnp.vdot(E_, jax.jvp(g, (A,), (E_,))[1]), jnp.vdot(E_, (g(A + 1e-5 * E_) - g(A - 1e-5 * E_)) / 2e-5)

    sin_loss = lambda A: jnp.sum(W[: A.shape[0]] * mf.svd_matrix_function(A, jnp.sin))  # noqa: E731
    for A in (sp._M43, np.diag([1.0, 2.0, 0.0]), np.eye(3), np.diag([1.0, 2.0, 2.0])):
        ad, fd = second(sin_loss, jnp.asarray(A))  # the first two: distinct singular values (as before)
        np.testing.assert_allclose(ad, fd, rtol=1e-6)


def test_nuclear_norm_second_derivatives_are_polars_at_repeated_singular_values():
    from rules.library.linalg import norm
    from rules.library.linalg_polar import polar

    rng = np.random.default_rng(9)
    E = jnp.asarray(rng.normal(size=(3, 3)))
    second = lambda f, A: jnp.vdot(E, jax.jvp(jax.grad(f), (A,), (E,))[1])  # noqa: E731
    nuc, trace_p = (lambda A: norm(A, "nuc")), (lambda A: jnp.trace(polar(A)[1]))  # equal at full rank
    # NaN through the SVD's frame (wrong before that); now svd_matrix_function's, polar's
    np.testing.assert_allclose(second(nuc, REPEATED), second(trace_p, REPEATED), rtol=1e-9)
    A = jnp.asarray(rng.normal(size=(3, 3)))
    np.testing.assert_allclose(second(nuc, A), second(trace_p, A), rtol=1e-9)
