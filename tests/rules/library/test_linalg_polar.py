"""rules.library.linalg_polar: polar, smooth at full rank where JAX's is an error (qdwh) or NaN (svd)."""

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest

from rules.library import linalg_polar as pl
from rules.library import linalg_spectral as sp
from rules.testing import rand_tangent, test_frule, test_rrule


def test_the_module_ships_its_rules(shipped):
    assert shipped("linalg_polar") == set(pl.__all__)


# ----- polar: smooth at full rank, where JAX is an error (qdwh) or NaN (svd) ---------------------
def test_polar_has_jax_signature_and_value():
    import inspect

    def parameters(f):  # names, kinds, defaults (annotations differ in spelling only)
        return [(q.name, q.kind, q.default) for q in inspect.signature(f).parameters.values()]

    assert parameters(pl.polar) == parameters(jsl.polar)
    for A, side in ((sp._M43, "right"), (sp._M43.T, "left"), (sp._M3Z, "right")):
        for got, want in zip(pl.polar(A, side), jsl.polar(A, side)):
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)
    got = pl.polar(sp._M43, method="svd")  # method, eps, max_iterations reach JAX's value
    np.testing.assert_allclose(got[0], jsl.polar(sp._M43)[0], rtol=1e-12, atol=1e-13)


def test_polar_is_differentiable_at_a_rotation_where_jax_is_not():
    R = jnp.asarray(pl._ROTATION)  # orthogonal: u = R, p = I, singular values all 1
    G = jnp.arange(9.0).reshape(3, 3) - 3
    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work"):  # qdwh: a while loop
        jax.grad(lambda A: jnp.sum(G * jsl.polar(A)[0]))(R)
    jax_grad = jax.grad(lambda A: jnp.sum(G * jsl.polar(A, method="svd")[0]))(R)  # 1/(s_j^2 - s_i^2)
    assert not np.isfinite(jax_grad).any()  # NaN everywhere on CPU; +-inf on a few entries on a GPU
    # true (P = I): dU = R Omega, Omega = (X - X^T) / 2, X = R^T dA: the gradient is (G - R G^T R) / 2;
    # dP = herm(X): the gradient of <G, P> is R herm(G)
    np.testing.assert_allclose(jax.grad(lambda A: jnp.sum(G * pl.polar(A)[0]))(R), (G - R @ G.T @ R) / 2,
                               rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda A: jnp.sum(G * pl.polar(A)[1])))(R), R @ (G + G.T) / 2,
                               rtol=1e-12, atol=1e-14)
    test_rrule(pl.polar, pl._ROTATION)  # and the testers (finite differences, jit, vmap)
    test_frule(pl.polar, pl._ROTATION)


@pytest.mark.parametrize("A, side", [
    (sp._M43[:3], "right"), (sp._M43, "right"), (sp._M3Z, "right"), (sp._M43.T, "left"), (sp._M3Z[:2], "left"),
], ids=["square", "tall", "complex", "left-wide", "left-complex-wide"])
def test_polar_agrees_with_jax_where_jax_is_right(A, side):
    rng = np.random.default_rng(4)
    seeds = [rng.normal(size=y.shape) + 1j * rng.normal(size=y.shape) for y in pl.polar(A, side)]

    def loss(polar):
        return lambda A: sum(jnp.sum(jnp.real(g * y)) for g, y in zip(seeds, polar(A, side)))

    jax_polar = lambda A, side: jsl.polar(A, side, method="svd")  # noqa: E731  (distinct singular values)
    np.testing.assert_allclose(jax.grad(loss(pl.polar))(A), jax.grad(loss(jax_polar))(A), rtol=1e-9, atol=1e-12)
    A_dot = rand_tangent(np.asarray(A), seed=1)
    np.testing.assert_allclose(jax.jvp(loss(pl.polar), (A,), (A_dot,))[1],
                               jax.jvp(loss(jax_polar), (A,), (A_dot,))[1], rtol=1e-9)


def test_polar_is_nan_at_a_rank_deficient_matrix():
    A = jnp.array([[1.0, 2.0], [2.0, 4.0]])  # rank 1: u is not unique, p = (A^T A)^(1/2) has a kink
    assert np.isnan(jax.grad(lambda A: jnp.sum(pl.polar(A)[0]))(A)).all()
    assert np.isnan(jax.jvp(lambda A: pl.polar(A)[1], (A,), (jnp.eye(2),))[1]).all()


def _polar_by_newton(A, side="right"):
    """(u, p) by 40 Newton steps X <- (X + X (X^H X)^{-1}) / 2 in plain JAX: smooth, and converged to
    rounding at these matrices, so its derivatives of every order are those of the polar factors."""
    B = A if side == "right" else jnp.conj(A.T)
    X = jax.lax.fori_loop(0, 40, lambda i, X: (X + X @ jnp.linalg.inv(jnp.conj(X.T) @ X)) / 2, B)  # static: a scan
    P = jnp.conj(X.T) @ B
    return (X, (P + jnp.conj(P.T)) / 2) if side == "right" else (jnp.conj(X.T), (P + jnp.conj(P.T)) / 2)


@pytest.mark.parametrize("A, side", [
    (pl._ROTATION, "right"), (np.diag([1.0, 2.0, 2.0]), "right"), (sp._M43, "right"), (sp._M3Z, "right"),
    (sp._M43.T, "left"),
], ids=["rotation", "repeated", "tall", "complex", "left-wide"])
def test_polar_second_and_third_derivatives_are_exact_at_repeated_singular_values(A, side):
    # through the eigenvectors of p they were NaN at every orthogonal matrix, and rev-over-rev
    # differentiated JAX's QDWH iteration (an error)
    rng = np.random.default_rng(7)
    seeds = [rng.normal(size=y.shape) + 1j * rng.normal(size=y.shape) for y in pl.polar(A, side)]
    dots = [rand_tangent(np.asarray(A), seed=k) for k in range(3)]

    def loss(polar):
        return lambda A: sum(jnp.sum(jnp.real(g * y)) for g, y in zip(seeds, polar(A, side)))

    def second(f, A):  # <dots[1], hessian(f)(A) dots[0]>, by forward over forward
        return jax.jvp(lambda B: jax.jvp(f, (B,), (dots[0],))[1], (A,), (dots[1],))[1]

    want = jax.jit(second, static_argnums=0)(loss(_polar_by_newton), A)  # compiled: op by op is slow
    np.testing.assert_allclose(second(loss(pl.polar), A), want, rtol=1e-8)
    if not np.iscomplexobj(A):  # jax.hessian's real basis
        hessian = jax.jit(jax.hessian(loss(_polar_by_newton)))(A)
        np.testing.assert_allclose(jax.jacrev(jax.grad(loss(pl.polar)))(A), hessian, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(jax.jit(jax.vmap(jax.hessian(loss(pl.polar))))(A[None])[0], hessian,
                                   rtol=1e-8, atol=1e-10)
    third = jax.jit(lambda f: jax.jvp(lambda C: second(f, C), (A,), (dots[2],))[1], static_argnums=0)
    np.testing.assert_allclose(third(loss(pl.polar)), third(loss(_polar_by_newton)), rtol=1e-7)
