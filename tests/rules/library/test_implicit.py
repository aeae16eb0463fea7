"""rules.library.implicit: implicit differentiation against unrolled differentiation, and what it does better."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
from rules._check import _check_one
from rules._registry import examples_of, function_name, functions_with_examples
from rules.library._implicit_common import (
    _contraction,
    _coupled,
    _cubic,
    _deq_layer,
    _logistic_ridge,
    _quadratic,
    _shifted_matvec,
    _spd_matvec,
)
from rules.library.implicit import argmin, fixed_point, linear_solve, root

CASES = [
    pytest.param(f, ex, id=f"{function_name(f)}-{k}")
    for f in functions_with_examples(["rules.library.implicit"])
    for k, ex in enumerate(examples_of(f))
]

W = jnp.array([[0.3, -0.4, 0.2], [0.1, 0.5, -0.3], [-0.2, 0.25, 0.4]])
B = jnp.array([0.3, -0.5, 1.2])
A = jnp.array([[3.0, 0.5, -0.2], [0.4, 2.5, 0.3], [-0.1, 0.6, 2.8]])
FEATURES = jnp.array([[0.5, -1.0, 0.3], [1.2, 0.4, -0.7], [-0.3, 0.8, 1.1], [0.9, -0.2, 0.6]])
LABELS = jnp.array([1.0, 0.0, 1.0, 0.3])
SEED = jnp.array([0.7, -1.3, 0.4])  # a fixed output cotangent


def assert_trees_close(got, want, rtol):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(jnp.max(jnp.abs(w))))


# ----- every example passes the testers -----------------------------------------------------
def test_the_module_ships_its_primitives():
    assert {function_name(f) for f, _ in (c.values for c in CASES)} >= {"fixed_point", "root", "linear_solve", "argmin"}


@pytest.mark.parametrize("f, example", CASES)
def test_rule_passes_the_testers(f, example):
    row = _check_one(f, example)
    assert row.status == "ok", row.message
    assert row.lowered == "jit+vmap"


# ----- a gradient where JAX has none, equal to unrolled differentiation at convergence --------
def _unrolled_fixed_point(theta, n=200):
    return jax.lax.fori_loop(0, n, lambda i, x: _deq_layer(x, theta), jnp.zeros(3))  # static bounds: a scan


def test_fixed_point_gradient_where_the_while_loop_has_none():
    def plain(theta):
        return SEED @ fixed_point.fn(_deq_layer, jnp.zeros(3), theta)  # the bare while_loop

    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work for lax.while_loop"):
        jax.grad(plain)((W, B))
    ours = jax.jit(jax.grad(lambda theta: SEED @ fixed_point(_deq_layer, jnp.zeros(3), theta)))((W, B))
    unrolled = jax.grad(lambda theta: SEED @ _unrolled_fixed_point(theta))((W, B))
    assert_trees_close(ours, unrolled, rtol=1e-6)


def test_root_gradient_where_newtons_loop_has_none():
    theta = (A, B)

    def unrolled(theta):
        def newton_step(i, x):
            return x - jnp.linalg.solve(jax.jacfwd(_coupled)(x, theta), _coupled(x, theta))

        return SEED @ jax.lax.fori_loop(0, 30, newton_step, jnp.zeros(3))

    with pytest.raises(ValueError, match="while_loop"):
        jax.grad(lambda t: SEED @ root.fn(_coupled, jnp.zeros(3), t))(theta)
    ours = jax.grad(lambda t: SEED @ root(_coupled, jnp.zeros(3), t))(theta)
    assert_trees_close(ours, jax.grad(unrolled)(theta), rtol=1e-6)
    x = root(_coupled, jnp.zeros(3), theta)
    assert float(jnp.max(jnp.abs(_coupled(x, theta)))) < 1e-12


def test_argmin_gradient_is_the_bilevel_gradient():
    theta = (FEATURES, LABELS, jnp.array(0.5))

    def unrolled(theta):  # gradient descent with step 1/L (L >= |A|^2 / 4 + lam), unrolled
        def descent_step(i, x):
            return x - 0.5 * jax.grad(_logistic_ridge)(x, theta)

        return SEED @ jax.lax.fori_loop(0, 300, descent_step, jnp.zeros(3))

    with pytest.raises(ValueError, match="while_loop"):
        jax.grad(lambda t: SEED @ argmin.fn(_logistic_ridge, jnp.zeros(3), t))(theta)
    ours = jax.grad(lambda t: SEED @ argmin(_logistic_ridge, jnp.zeros(3), t))(theta)
    assert_trees_close(ours, jax.jit(jax.grad(unrolled))(theta), rtol=1e-6)


def test_linear_solve_agrees_with_jax_where_jax_is_right():
    # JAX's cg is itself implicit (for parameters the operator closes over): the two agree,
    # and both equal the dense solve's gradient.
    b = jnp.array([1.0, -2.0, 0.5])

    def ours(a, b):
        return SEED @ linear_solve(_spd_matvec, b, a)

    def jax_cg(a, b):
        return SEED @ jax.scipy.sparse.linalg.cg(lambda x: _spd_matvec(x, a), b, tol=1e-12)[0]

    def dense(a, b):
        return SEED @ jnp.linalg.solve(a.T @ a + jnp.eye(3), b)

    got = jax.grad(ours, (0, 1))(W, b)
    assert_trees_close(got, jax.grad(jax_cg, (0, 1))(W, b), rtol=1e-8)
    assert_trees_close(got, jax.grad(dense, (0, 1))(W, b), rtol=1e-8)


def test_memory_is_constant_in_the_number_of_iterations():
    n, iters = 1000, 1000
    theta = jnp.linspace(-1.0, 1.0, n)

    def ours(theta):
        return jnp.sum(fixed_point(_contraction, jnp.zeros(n), theta, max_iter=iters) ** 2)

    def unrolled(theta):
        x = jax.lax.fori_loop(0, iters, lambda i, x: _contraction(x, theta), jnp.zeros(n))
        return jnp.sum(x**2)

    compiled = {f.__name__: jax.jit(jax.grad(f)).lower(theta).compile() for f in (ours, unrolled)}
    stats = {k: c.memory_analysis() for k, c in compiled.items()}
    if any(s is None for s in stats.values()):
        pytest.skip("this backend gives no memory analysis")
    # the unrolled gradient keeps every iterate: iters * n * 8 bytes; ours, a few vectors
    assert stats["unrolled"].temp_size_in_bytes >= iters * n * 8
    assert stats["ours"].temp_size_in_bytes * 20 < stats["unrolled"].temp_size_in_bytes
    assert stats["ours"].argument_size_in_bytes <= stats["unrolled"].argument_size_in_bytes
    np.testing.assert_allclose(compiled["ours"](theta), compiled["unrolled"](theta), rtol=1e-6)


# ----- documented behaviour -----------------------------------------------------------------
def test_x0_gets_a_zero_tangent_and_f_no_tangent():
    _, back = rules.rrule(fixed_point, _contraction, jnp.zeros(3), B)
    f_bar, fn_bar, x0_bar, theta_bar = back(SEED)
    assert f_bar is rules.NoTangent() and fn_bar is rules.NoTangent()
    assert x0_bar is rules.ZeroTangent()
    assert theta_bar.shape == (3,)
    g = jax.grad(lambda x0: jnp.sum(fixed_point(_contraction, x0, B)))(jnp.ones(3))
    assert float(jnp.max(jnp.abs(g))) == 0.0


def test_gmres_adjoint_and_gradient_descent_agree_with_the_defaults():
    seeded = lambda f: lambda *a: SEED @ f(*a)  # noqa: E731
    by_iteration = jax.grad(seeded(lambda t: fixed_point(_deq_layer, jnp.zeros(3), t)))((W, B))
    by_gmres = jax.grad(seeded(lambda t: fixed_point(_deq_layer, jnp.zeros(3), t, adjoint="gmres")))((W, B))
    assert_trees_close(by_gmres, by_iteration, rtol=1e-9)

    theta = (W, B)
    newton = jax.grad(seeded(lambda t: argmin(_quadratic, jnp.zeros(3), t)))(theta)
    descent = jax.grad(seeded(lambda t: argmin(_quadratic, jnp.zeros(3), t, method="gradient_descent")))(theta)
    assert_trees_close(descent, newton, rtol=1e-6)


def test_linear_solve_gmres_uses_the_transposed_operator():
    a, b = 0.3 * W, jnp.array([1.0, -2.0, 0.5])  # 4 I + a: nonsymmetric

    def ours(a, b):
        return SEED @ linear_solve(_shifted_matvec, b, a, method="gmres")

    def dense(a, b):
        return SEED @ jnp.linalg.solve(4 * jnp.eye(3) + a, b)

    np.testing.assert_allclose(linear_solve(_shifted_matvec, b, a, method="gmres"),
                               jnp.linalg.solve(4 * jnp.eye(3) + a, b), rtol=1e-10)
    assert_trees_close(jax.grad(ours, (0, 1))(a, b), jax.grad(dense, (0, 1))(a, b), rtol=1e-8)


def test_hessian_works_forward_over_reverse():
    def loss(t):
        return jnp.sum(fixed_point(_contraction, jnp.zeros(2), t) ** 2)

    def unrolled(t):
        return jnp.sum(jax.lax.fori_loop(0, 200, lambda i, x: _contraction(x, t), jnp.zeros(2)) ** 2)

    t = jnp.array([0.3, -0.5])
    np.testing.assert_allclose(jax.hessian(loss)(t), jax.hessian(unrolled)(t), rtol=1e-6, atol=1e-12)


def test_a_closure_over_a_traced_value_is_refused():
    def loss(a):
        return jnp.sum(fixed_point(lambda x, theta: _contraction(x, theta) + a, jnp.zeros(2), jnp.ones(2)))

    with pytest.raises(rules.StaticArgumentError, match="theta"):
        jax.grad(loss)(1.0)
    with pytest.raises(rules.StaticArgumentError, match="captures a traced value"):
        jax.jit(loss)(1.0)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="1-D"):
        root(_cubic, jnp.zeros((2, 2)), jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="real"):
        argmin(_quadratic, jnp.zeros(3, jnp.complex128), (W, B))
    with pytest.raises(ValueError, match="symmetric=False"):
        linear_solve(_spd_matvec, B, W, method="cg", symmetric=False)
    with pytest.raises(ValueError, match="method"):
        argmin(_quadratic, jnp.zeros(3), (W, B), method="bfgs")
    with pytest.raises(ValueError, match="shaped like x"):
        fixed_point(lambda x, t: jnp.sum(x) + t, jnp.zeros(3), 1.0)
