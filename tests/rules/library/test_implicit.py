"""rules.library.implicit: implicit differentiation against unrolled differentiation, and what it does better."""

from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
from rules._registry import function_name
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
from rules.library import implicit
from rules.library.implicit import ConvergenceError, SolveInfo, argmin, fixed_point, linear_solve, root

W = jnp.array([[0.3, -0.4, 0.2], [0.1, 0.5, -0.3], [-0.2, 0.25, 0.4]])
B = jnp.array([0.3, -0.5, 1.2])
A = jnp.array([[3.0, 0.5, -0.2], [0.4, 2.5, 0.3], [-0.1, 0.6, 2.8]])
FEATURES = jnp.array([[0.5, -1.0, 0.3], [1.2, 0.4, -0.7], [-0.3, 0.8, 1.1], [0.9, -0.2, 0.6]])
LABELS = jnp.array([1.0, 0.0, 1.0, 0.3])
SEED = jnp.array([0.7, -1.3, 0.4])  # a fixed output cotangent
WIDE = jnp.asarray(np.random.default_rng(0).normal(scale=2.0, size=(30, 30)))  # 4 I + WIDE: GMRES(20) restarts


def assert_trees_close(got, want, rtol):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(jnp.max(jnp.abs(w))))


# ----- the module's primitives (their examples are checked in test_every_example.py) ---------
def test_the_module_ships_its_primitives(shipped):
    assert shipped("implicit") >= {"fixed_point", "root", "linear_solve", "argmin"}


# ----- a gradient where JAX has none, equal to unrolled differentiation at convergence --------
def _unrolled_fixed_point(theta, n=200):
    return jax.lax.fori_loop(0, n, lambda i, x: _deq_layer(x, theta), jnp.zeros(3))  # static bounds: a scan


def test_fixed_point_gradient_where_the_while_loop_has_none():
    def plain(theta):
        return SEED @ implicit._iterate(_deq_layer, jnp.zeros(3), theta, 1e-12, 1000)[0]  # the bare while_loop

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
        jax.grad(lambda t: SEED @ implicit._newton(_coupled, jnp.zeros(3), t, 1e-12, 50)[0])(theta)
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
        jax.grad(lambda t: SEED @ implicit._minimise(_logistic_ridge, jnp.zeros(3), t, 1e-12, "newton", 1000)[0])(theta)
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


def _tanh_map(x, t):
    return 0.5 * jnp.tanh(t[0] * x) + t[1]


def _quartic(x, t):  # stationary where x^3 + t0 x = t1
    return jnp.sum(0.25 * x**4 + 0.5 * t[0] * x**2 - t[1] * x)


def _unrolled(step, x0, n=300):
    return jax.lax.fori_loop(0, n, lambda i, x: step(x), x0)


SECOND_ORDER = {  # solve(x0, t), the same x* by plain JAX (unrolled, differentiable), a start
    "fixed_point": (lambda x0, t: fixed_point(_tanh_map, x0, t),
                    lambda t: _unrolled(lambda x: _tanh_map(x, t), jnp.zeros(2)), jnp.array([0.3, -0.2])),
    "fixed_point gmres": (lambda x0, t: fixed_point(_tanh_map, x0, t, adjoint="gmres"),
                          lambda t: _unrolled(lambda x: _tanh_map(x, t), jnp.zeros(2)), jnp.array([0.3, -0.2])),
    "argmin gradient_descent": (lambda x0, t: argmin(_quartic, x0, t, method="gradient_descent", tol=1e-14),
                                lambda t: _unrolled(lambda x: x - 0.5 * jax.grad(_quartic)(x, t), jnp.ones(2)),
                                jnp.array([0.9, 1.1])),
    "root": (lambda x0, t: root(lambda x, t: x**3 + t[0] * x - t[1], x0, t),
             lambda t: _unrolled(lambda x: x - (x**3 + t[0] * x - t[1]) / (3 * x**2 + t[0]), jnp.ones(2), 30),
             jnp.array([0.9, 1.1])),
}


@pytest.mark.parametrize("case", list(SECOND_ORDER))
def test_second_derivatives_are_right_from_any_start_even_the_solution(case):
    # jax.hessian runs the rule's own forward pass on the plain solver; its x* carries the
    # implicit tangent, not the while_loop's (which stopped after one step from x0 = x*:
    # fixed_point's Hessian was 1.18 off at x0 = x*, argmin's by gradient descent 1.09)
    solve, unrolled, x0 = SECOND_ORDER[case]
    t = jnp.array([0.7, 0.4])

    def loss(t, x0):
        return jnp.sum(solve(x0, t) ** 2)

    want = jax.hessian(lambda t: jnp.sum(unrolled(t) ** 2))(t)
    x_star = solve(x0, t)
    for start in (x0, x_star):
        np.testing.assert_allclose(jax.jacfwd(jax.grad(loss))(t, start), want, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(jax.jacrev(jax.grad(loss))(t, start), want, rtol=1e-6, atol=1e-9)
    t_dot = jnp.array([1.0, -0.5])
    _, x_dot = jax.jvp(lambda t: solve(x_star, t), (t,), (t_dot,))  # first order: the transposed pullback
    np.testing.assert_allclose(x_dot, jax.jacfwd(unrolled)(t) @ t_dot, rtol=1e-6, atol=1e-9)


def test_the_plain_solvers_forward_mode_is_implicit():
    # the plain functions (what a rule's forward pass runs under forward mode) differentiate x*,
    # not the loop: from x0 = x* the loop's tangent would be one step's
    t, t_dot = jnp.array([0.7, 0.4]), jnp.array([1.0, -0.5])
    x_star = fixed_point(_tanh_map, jnp.zeros(2), t)
    _, x_dot = jax.jvp(lambda t: fixed_point.fn(_tanh_map, x_star, t), (t,), (t_dot,))
    want = jax.jacfwd(lambda t: _unrolled(lambda x: _tanh_map(x, t), jnp.zeros(2)))(t) @ t_dot
    np.testing.assert_allclose(x_dot, want, rtol=1e-10)
    _, loop_dot = jax.jvp(lambda t: implicit._iterate(_tanh_map, x_star, t, 1e-12, 1000)[0], (t,), (t_dot,))
    assert not np.allclose(loop_dot, want, rtol=1e-2)  # what it was: the bare loop's tangent
    grads = jax.grad(lambda t: jnp.sum(fixed_point.fn(_tanh_map, x_star, t) ** 2))(t)  # and transposable
    np.testing.assert_allclose(grads, jax.grad(lambda t: jnp.sum(fixed_point(_tanh_map, x_star, t) ** 2))(t), rtol=1e-10)


def test_second_derivatives_of_linear_solve_both_ways():
    # the Krylov solvers that report convergence keep JAX's cg's derivatives: forward over
    # reverse (jax.hessian) and reverse over reverse, equal to the dense solve's
    b = jnp.array([1.0, -2.0, 0.5])

    def ours(b):
        return jnp.sum(linear_solve(_spd_matvec, b, W) ** 2)

    def dense(b):
        return jnp.sum(jnp.linalg.solve(W.T @ W + jnp.eye(3), b) ** 2)

    want = jax.hessian(dense)(b)
    np.testing.assert_allclose(jax.hessian(ours)(b), want, rtol=1e-9)
    np.testing.assert_allclose(jax.grad(lambda b: SEED @ jax.grad(ours)(b))(b), want @ SEED, rtol=1e-9)


def test_forward_mode_through_the_transposed_pullback():
    # the adjoint solves are transposable linear solves (their convergence check inside), so
    # the lowering's forward mode from an rrule alone (the transposed pullback) serves them
    t_dot = jnp.array([1.0, 0.5, -2.0])
    cases = [
        lambda t: fixed_point(_deq_layer, jnp.zeros(3), (W, t)),
        lambda t: linear_solve(_spd_matvec, t, W),
    ]
    for f in cases:
        _, y_dot = jax.jvp(f, (B,), (t_dot,))
        np.testing.assert_allclose(y_dot, jax.jacrev(f)(B) @ t_dot, rtol=1e-9)


def test_a_closure_over_a_traced_value_is_refused():
    def loss(a):
        return jnp.sum(fixed_point(lambda x, theta: _contraction(x, theta) + a, jnp.zeros(2), jnp.ones(2)))

    with pytest.raises(rules.StaticArgumentError, match="theta") as err:
        jax.grad(loss)(1.0)
    assert "equinox.Module" in str(err.value)  # the other way to pass arrays
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


# ----- no silent wrong answer: an unconverged solve raises ----------------------------------
# Under jit the check's callback raises on the host; JAX re-raises a JaxRuntimeError (a
# RuntimeError), or a ValueError from jit's C++ fast path, carrying our message.
RUNTIME_ERRORS = (RuntimeError, ValueError)


def _slow(x, a):
    """0.999 x + a: x* = 1000 a, about 30000 iterations to tol 1e-12 (10 get to 9.955 a)."""
    return 0.999 * x + a


def _rate_09(x, a):
    return 0.9 * x + a


def _blows_up(x, a):
    return x * x + a


def test_an_unconverged_fixed_point_raises_instead_of_returning_a_wrong_answer():
    x, info = fixed_point(_slow, 0.0, 1.0, max_iter=10, throw=False, full_output=True)
    assert float(x) == pytest.approx(9.955, abs=1e-3)  # the answer is 1000
    assert (int(info.iterations), bool(info.converged)) == (10, False)
    with pytest.raises(ConvergenceError) as err:
        fixed_point(_slow, 0.0, 1.0, max_iter=10)
    assert isinstance(err.value, RuntimeError)
    message = str(err.value)
    for part in ("`fixed_point`", f"residual {float(info.residual):.3g}", "after 10 iterations", "max_iter=10",
                 "tol = 1e-12", "raise max_iter", "loosen tol", "throw=False"):
        assert part in message


@pytest.mark.parametrize(
    "solve, args, kwargs",
    [
        (root, (_cubic, jnp.zeros(1), jnp.array([2.0])), {"max_iter": 1}),
        (argmin, (_logistic_ridge, jnp.zeros(3), (FEATURES, LABELS, jnp.array(0.5))), {"max_iter": 1}),
        (linear_solve, (_spd_matvec, B, W), {"maxiter": 1}),
        (linear_solve, (_shifted_matvec, jnp.ones(30), WIDE), {"method": "gmres", "maxiter": 1}),  # n > 20: restarts
    ],
    ids=["root", "argmin", "linear_solve-cg", "linear_solve-gmres"],
)
def test_every_solver_raises_when_it_stops_short(solve, args, kwargs):
    name = function_name(solve)
    with pytest.raises(ConvergenceError, match=f"`{name}`: its solver stopped before meeting its tolerance"):
        solve(*args, **kwargs)
    x, info = solve(*args, **kwargs, throw=False, full_output=True)
    assert not bool(info.converged) and int(info.iterations) == 1 and float(info.residual) > 0


def test_the_check_runs_under_jit_vmap_and_grad():
    jitted = jax.jit(jax.vmap(lambda a: fixed_point(_slow, 0.0, a, max_iter=10)))
    np.testing.assert_array_equal(jitted(jnp.zeros(2)), 0.0)  # x* = 0 converges at once
    with pytest.raises(RUNTIME_ERRORS, match=r"(?s)`fixed_point`: its solver stopped.*1 of 2 batch elements"):
        jitted(jnp.array([0.0, 1.0])).block_until_ready()
    with pytest.raises(RUNTIME_ERRORS, match="`fixed_point`: its solver stopped"):
        jax.jit(lambda a: fixed_point(_slow, 0.0, a, max_iter=10))(1.0).block_until_ready()
    # the gradient needs x* (f is nonlinear), so the forward check stays in jit(grad)
    grad = jax.jit(jax.grad(lambda t: fixed_point(_contraction, 0.0, t, max_iter=3, adjoint="gmres")))
    with pytest.raises(RUNTIME_ERRORS, match="`fixed_point`: its solver stopped"):
        grad(1.0).block_until_ready()


def test_nan_and_inf_stop_the_iteration_and_raise():
    x, info = fixed_point(_blows_up, 0.0, 1.0, throw=False, full_output=True)
    assert np.isnan(float(info.residual)) and not bool(info.converged)
    assert int(info.iterations) < 20  # stopped at the first non-finite step, not at max_iter=1000
    with pytest.raises(ConvergenceError, match="not finite"):
        fixed_point(_blows_up, 0.0, 1.0)


def test_an_unconverged_adjoint_solve_raises_instead_of_a_wrong_gradient():
    # the forward solve converges at once (|x_1 - x_0| = 1e-10 <= tol), the adjoint
    # u <- 1 + 0.9 u (a relative test) needs ~130 iterations: 20 give 8.906 instead of 10
    def loss(a, throw=True):
        return fixed_point(_rate_09, 0.0, a, tol=1e-6, max_iter=20, throw=throw)

    assert float(jax.grad(lambda a: loss(a, throw=False))(1e-10)) == pytest.approx((1 - 0.9**21) / 0.1)
    with pytest.raises(ConvergenceError, match="`fixed_point`: the adjoint solve of its pullback stopped") as err:
        jax.grad(loss)(1e-10)
    assert "adjoint='gmres'" in str(err.value)
    with pytest.raises(RUNTIME_ERRORS, match="the adjoint solve of its pullback stopped"):
        jax.jit(jax.grad(loss))(1e-10).block_until_ready()

    # linear_solve: b = e1 is an eigenvector (one CG step), the seed (1, 1, 1) is not
    a = jnp.diag(jnp.array([0.0, 1.0, 2.0**0.5]))  # A = a^T a + I = diag(1, 2, 3)
    e1 = jnp.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(linear_solve(_spd_matvec, e1, a, maxiter=1), e1)
    with pytest.raises(ConvergenceError, match="`linear_solve`: the adjoint solve"):
        jax.grad(lambda b: jnp.sum(linear_solve(_spd_matvec, b, a, maxiter=1)))(e1)



def test_an_unconverged_tangent_solve_raises_instead_of_a_wrong_derivative():
    # forward mode of the plain solver (as under jax.hessian): v <- theta_dot + 0.9 v needs
    # ~130 iterations; 20 give 8.906 instead of 10
    def solve(a, throw=True):
        return fixed_point.fn(_rate_09, 0.0, a, tol=1e-6, max_iter=20, throw=throw)

    assert float(jax.jvp(lambda a: solve(a, throw=False), (1e-10,), (1.0,))[1]) == pytest.approx((1 - 0.9**21) / 0.1)
    with pytest.raises(RUNTIME_ERRORS, match="`fixed_point`: the tangent solve of its forward-mode derivative stopped"):
        jax.jit(lambda a: jax.jvp(solve, (a,), (1.0,))[1])(1e-10).block_until_ready()

    # linear_solve: b an eigenvector of A (one CG step), b_dot not (its tangent had no check)
    a = jnp.asarray(W)
    b = jnp.asarray(np.linalg.eigh(a.T @ a + np.eye(3))[1][:, 0])

    def lsolve(b, throw=True):
        return linear_solve.fn(_spd_matvec, b, a, maxiter=1, throw=throw)

    np.testing.assert_allclose(lsolve(b), jnp.linalg.solve(a.T @ a + jnp.eye(3), b), atol=1e-12)
    e1 = jnp.array([1.0, 0.0, 0.0])
    jax.jvp(lambda b: lsolve(b, throw=False), (b,), (e1,))
    with pytest.raises(RUNTIME_ERRORS, match="`linear_solve`: the tangent solve of its forward-mode derivative"):
        jax.jit(lambda b: jax.jvp(lsolve, (b,), (e1,))[1])(b).block_until_ready()

# ----- full_output: the residual and iteration count ----------------------------------------
def test_full_output_reports_the_solve_and_differentiates_x_only():
    x, info = fixed_point(_contraction, 0.0, 1.0, full_output=True)
    assert isinstance(info, SolveInfo) and float(x) == pytest.approx(1.44761, abs=1e-5)
    assert bool(info.converged) and 0 < int(info.iterations) < 100 and float(info.residual) <= 1e-12
    assert info.iterations.dtype == jnp.int32 and info.converged.dtype == bool

    jitted_x, jitted_info = jax.jit(lambda t: fixed_point(_contraction, 0.0, t, full_output=True))(1.0)
    assert float(jitted_x) == float(x) and int(jitted_info.iterations) == int(info.iterations)
    g = jax.grad(lambda t: fixed_point(_contraction, 0.0, t, full_output=True)[0])(1.0)
    assert float(g) == pytest.approx(1.110237, abs=1e-6)  # as without full_output
    no_gradient = jax.grad(lambda t: fixed_point(_contraction, 0.0, t, full_output=True)[1].residual)(1.0)
    assert float(no_gradient) == 0.0


# ----- callable pytrees: f's arrays are differentiated like theta ---------------------------
class WithParams(eqx.Module):
    """An equinox Module holding the parameters of a module-level example function."""

    fn: Callable = eqx.field(static=True)
    params: Any

    def __call__(self, x, theta):
        return self.fn(x, self.params)


def test_an_equinox_module_f_is_differentiated_like_theta():
    x0, theta = jnp.zeros(3), (W, B)
    module = WithParams(_deq_layer, theta)

    def by_theta(t):
        return SEED @ fixed_point(_deq_layer, x0, t)

    def by_module(m):
        return SEED @ fixed_point(m, x0, ())

    assert float(by_module(module)) == pytest.approx(float(by_theta(theta)), rel=1e-12)
    want = jax.grad(by_theta)(theta)
    got = eqx.filter_jit(eqx.filter_grad(by_module))(module)
    assert isinstance(got, WithParams)
    assert_trees_close(got.params, want, rtol=1e-10)
    _, back = rules.rrule(fixed_point, module, x0, ())
    assert_trees_close(back(SEED)[1].params, want, rtol=1e-10)  # ChainRules: a cotangent of f's type

    # batched modules (vmap over the arrays f holds)
    scales = jnp.array([0.5, 1.0])
    batched = jax.vmap(lambda s: by_module(WithParams(_deq_layer, (s * W, B))))(scales)
    np.testing.assert_allclose(batched, [by_theta((s * W, B)) for s in scales], rtol=1e-12)


@pytest.mark.parametrize(
    "solve, fn, x0, theta",
    [
        (root, _coupled, jnp.zeros(3), (A, B)),
        (linear_solve, _spd_matvec, B, W),
        (argmin, _quadratic, jnp.zeros(3), (W, B)),
    ],
    ids=["root", "linear_solve", "argmin"],
)
def test_every_solver_takes_a_module(solve, fn, x0, theta):
    by_theta = jax.grad(lambda t: SEED @ solve(fn, x0, t))(theta)
    by_module = eqx.filter_grad(lambda m: SEED @ solve(m, x0, ()))(WithParams(fn, theta))
    assert_trees_close(by_module.params, by_theta, rtol=1e-9)


def test_fixed_point_gradient_agrees_with_optimistix_implicit_adjoint():
    """What users would otherwise call: optimistix.fixed_point with ImplicitAdjoint gives the
    same solution and parameter gradient (benchmarks/library.py times the two)."""
    import optimistix as optx

    rng = np.random.default_rng(3)
    n = 6
    w = jnp.asarray(rng.standard_normal((n, n)) / (2 * np.sqrt(n)))
    b = jnp.asarray(rng.standard_normal(n))
    x0 = jnp.zeros(n)
    layer = lambda x, theta: jnp.tanh(theta[0] @ x + theta[1]) / 2  # noqa: E731
    solver = optx.FixedPointIteration(rtol=1e-12, atol=1e-12)

    def ours(theta):
        return jnp.sum(jnp.sin(fixed_point(layer, x0, theta, tol=1e-12, max_iter=500)))

    def theirs(theta):
        sol = optx.fixed_point(lambda y, t: layer(y, t), solver, x0, args=theta,
                               adjoint=optx.ImplicitAdjoint(), max_steps=500)
        return jnp.sum(jnp.sin(sol.value))

    np.testing.assert_allclose(ours((w, b)), theirs((w, b)), rtol=1e-10)
    for mine, other in zip(jax.grad(ours)((w, b)), jax.grad(theirs)((w, b))):
        np.testing.assert_allclose(mine, other, rtol=1e-8, atol=1e-12)
