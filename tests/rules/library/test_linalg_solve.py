"""rules.library.linalg_solve: every rule verified by the testers, and what it does better."""

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest

from rules.library import linalg_solve as ls


def test_the_module_ships_its_rules(shipped):
    assert shipped("linalg_solve") == set(ls.__all__)


# ----- forward mode: jax.jvp runs the frule, jax.grad the rrule ---------------------------------
_SPD = np.stack([ls._SPD3Z, ls._SPD3Z.T]).astype(np.complex64)  # a batch of two
_GARBAGE = np.array([[0.0, 0.7, -1.3], [2.1, 0.0, 0.4], [-0.6, 1.8, 0.0]])  # off the diagonal


@pytest.mark.parametrize("f, args, static, options", [  # inputs beyond the examples: batches, dtypes
    (ls.solve, (ls._M3Z.astype(np.complex64), (ls._B3 + 0.5j).astype(np.complex64)), (), {}),
    (ls.cholesky, (_SPD,), (), dict(full=True)),
    (ls.cho_solve, (np.linalg.cholesky(ls._SPD3Z).conj().T + np.tril(_GARBAGE), ls._V3Z), (), dict(lower=False)),
    (ls.triangular_solve, ((ls._L3 + np.triu(_GARBAGE)).astype(np.float32), ls._B3.astype(np.float32)), (), {}),
    (ls.lstsq, (ls._M43 + 0.3j * ls._M43[::-1], ls._B4 - 0.2j), (), {}),
], ids=["solve-complex64", "cholesky-batch-complex64", "cho_solve-upper-complex", "triangular_solve-float32",
        "lstsq-complex"])
def test_jax_jvp_runs_the_frule_and_jax_grad_the_rrule(f, args, static, options, check_forward_mode):
    check_forward_mode(f, *args, static=static, **options)


# ----- value added: where plain JAX is NaN ------------------------------------------------------
def test_lstsq_is_finite_at_repeated_singular_values_where_jax_is_nan():
    A, b = jnp.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]), jnp.array([1.0, 2.0, 3.0])
    w = jnp.array([1.0, -3.0])
    assert np.isnan(jax.grad(lambda A: w @ jnp.linalg.lstsq(A, b)[0])(A)).all()
    ours = jax.grad(lambda A: w @ ls.lstsq(A, b))(A)
    normal_equations = jax.grad(lambda A: w @ jnp.linalg.solve(A.T @ A, A.T @ b))(A)
    np.testing.assert_allclose(ours, normal_equations, rtol=1e-12, atol=1e-14)


# ----- documented behaviour -------------------------------------------------------------------
def test_solve_factorises_once_and_reuses_the_lu_in_the_pullback(count_equations):
    # (jnp.linalg.solve also factorises once, through jax.lax.custom_linear_solve)
    A, b = jnp.asarray(ls._M3), jnp.asarray(ls._B3)
    grads = jax.make_jaxpr(jax.grad(lambda A, b: jnp.sum(ls.solve(A, b) ** 2), argnums=(0, 1)))(A, b)
    assert count_equations(grads.jaxpr, "lu") == 1


def test_cholesky_cotangent_is_symmetric_and_composes_with_cho_solve():
    A, b = jnp.asarray(ls._SPD3), jnp.asarray(ls._V3)
    g = jax.grad(lambda A: jnp.sum(ls.cholesky(A)))(A)
    np.testing.assert_allclose(g, g.T, rtol=1e-14)
    via_factor = jax.grad(lambda A, b: b @ ls.cho_solve(ls.cholesky(A), b), argnums=(0, 1))(A, b)
    via_solve = jax.grad(lambda A, b: b @ jnp.linalg.solve((A + A.T) / 2, b), argnums=(0, 1))(A, b)
    for ours, jaxs in zip(via_factor, via_solve):
        np.testing.assert_allclose(ours, jaxs, rtol=1e-10)


def test_triangular_solve_cotangent_lives_on_the_triangle_it_reads():
    a, b = jnp.asarray(ls._M3), jnp.asarray(ls._V3)  # full matrix: only one triangle is read
    lower = jax.grad(lambda a: jnp.sum(ls.triangular_solve(a, b)))(a)
    upper = jax.grad(lambda a: jnp.sum(ls.triangular_solve(a, b, lower=False)))(a)
    np.testing.assert_array_equal(lower, np.tril(lower))
    np.testing.assert_array_equal(upper, np.triu(upper))


# ----- only the triangle that is read: to every order -------------------------------------------
def _solve_with_a_triangle(name, c, b, lower):
    """Plain JAX (no rule) on the triangle that `name` reads, through two/one triangular solves."""
    t = jnp.tril(c) if lower else jnp.triu(c)
    if name == "triangular_solve":
        return jsl.solve_triangular(t, b, lower=lower)
    first = jsl.solve_triangular(t, b, lower=lower, trans=0 if lower else "C")  # A = L L^H or U^H U
    return jsl.solve_triangular(t, first, lower=lower, trans="C" if lower else 0)


@pytest.mark.parametrize("name", ["cho_solve", "triangular_solve"])
@pytest.mark.parametrize("lower, b", [(True, ls._V3), (False, ls._B3)], ids=["lower-vector", "upper-matrix"])
def test_solves_with_a_triangle_ignore_the_other_one_in_both_modes_to_second_order(name, lower, b):
    # the unread triangle holds garbage (as scipy's cho_factor leaves it): the cotangent of c
    # must vanish there and not depend on it, and so must the hessian through the pullback
    part, other = (np.tril, np.triu) if lower else (np.triu, np.tril)
    clean = part(ls._L3 if lower else ls._L3.T)
    garbage = clean + other(np.array([[0.0, 0.7, -1.3], [2.1, 0.0, 0.4], [-0.6, 1.8, 0.0]]))
    f = getattr(ls, name)

    def loss(solve):
        def value(c, b):
            x = solve(c, b)
            return jnp.sum(x**2) + jnp.sum(jnp.sin(3 * x))

        return value

    ours, plain = loss(lambda c, b: f(c, b, lower)), loss(lambda c, b: _solve_with_a_triangle(name, c, b, lower))
    g_clean, g = jax.grad(ours)(clean, b), jax.grad(ours)(garbage, b)
    np.testing.assert_array_equal(g, part(g))
    np.testing.assert_allclose(g, g_clean, rtol=1e-13, atol=1e-15)
    expected = jax.hessian(plain, argnums=(0, 1))(garbage, b)
    for c in (clean, garbage):
        for got, want in zip(jax.tree.leaves(jax.hessian(ours, argnums=(0, 1))(c, b)), jax.tree.leaves(expected)):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    # forward mode (the frule): a tangent in the unread triangle moves nothing, to second order
    c_dot, b_dot = np.cos(np.arange(9.0)).reshape(3, 3), np.ones_like(b)
    unread = (other(c_dot, 1 if lower else -1), np.zeros_like(b))
    for inner, outer in (((c_dot, b_dot), unread), (unread, (c_dot, b_dot))):  # d^2 loss [inner, outer]
        first, second = jax.jvp(lambda c, b: jax.jvp(ours, (c, b), inner)[1], (garbage, b), outer)
        assert float(second) == 0.0 and (float(first) == 0.0) == (inner is unread)
