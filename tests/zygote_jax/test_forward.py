"""hessian, hessian_reverse, diaghessian, forward_jacobian, forwarddiff."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
import zygote_jax
from zygote_jax import GradientError, diaghessian, forward_jacobian, forwarddiff, gradient, hessian, hessian_reverse


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def maybe_jit(request):
    return jax.jit if request.param else (lambda fn: fn)


def _rrule_only(name, fn, derivative, scale, transposable=True):
    """A primitive with only an rrule, whose pullback is `scale * derivative(x) * y_bar`.

    Forward mode transposes that pullback; with `transposable=False` it multiplies through a
    `lax.while_loop`, which JAX cannot transpose, so the primitive has no forward mode.
    """
    prim = rules.primitive(fn, name=name)

    def prim_rrule(x):
        def prim_pullback(y_bar):
            if transposable:
                return rules.NoTangent(), scale * derivative(x) * y_bar
            _, x_bar = jax.lax.while_loop(
                lambda c: c[0] < 1, lambda c: (c[0] + 1, scale * derivative(x) * c[1]), (0, y_bar)
            )
            return rules.NoTangent(), x_bar

        return prim(x), prim_pullback

    prim.rrule(prim_rrule)
    return prim


# ----- hessian ----------------------------------------------------------------------------------
def test_hessian_examples(maybe_jit):
    close(maybe_jit(lambda x: hessian(lambda x: x[0] * x[1], x))(jnp.array([1.0, 2.0])), [[0.0, 1.0], [1.0, 0.0]])
    assert float(hessian(jnp.sin, np.pi / 2)) == -1.0
    assert float(hessian(lambda x: x**3, 2)) == 12.0  # an int argument is promoted


def test_hessian_matrix_argument_uses_linear_indexing():
    x = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    H = hessian(lambda x: jnp.sum(x**3), x)
    assert H.shape == (4, 4)
    close(H, np.diag(6 * np.asarray(x).ravel()))


def test_hessian_differentiates_the_pullback_of_an_rrule_only_primitive(maybe_jit):
    cube = _rrule_only("cube7", lambda x: x**3, lambda x: 3 * x**2, scale=7)  # deliberately 7x
    H = maybe_jit(lambda x: hessian(lambda x: jnp.sum(cube(x)), x))(jnp.array([1.0, 2.0]))
    close(H, np.diag([7 * 6 * 1.0, 7 * 6 * 2.0]))  # d/dx of the pullback 7 * 3x^2


@pytest.mark.parametrize("transposable", [True, False], ids=["transposable", "while_loop"])
def test_hessian_falls_back_to_reverse_over_reverse(transposable):
    # The pullback of `cube` calls `square`, another rrule-only primitive, on the primal:
    # forward mode meets `square` directly. Its pullback transposed serves forward mode; one
    # that JAX cannot transpose has none, and `hessian` falls back to reverse-over-reverse.
    square = _rrule_only("square7", lambda x: x * x, lambda x: 2 * x, scale=7, transposable=transposable)
    cube = rules.primitive(lambda x: x**3, name="cube_via_square")

    @cube.rrule
    def cube_rrule(x):
        def cube_pullback(y_bar):
            return rules.NoTangent(), 3 * square(x) * y_bar

        return cube(x), cube_pullback

    def f(x):
        return jnp.sum(cube(x))

    x = jnp.array([1.0, 2.0])
    if transposable:
        close(jax.hessian(f)(x), np.diag([42.0, 84.0]))
    else:
        with pytest.raises(rules.ForwardModeError, match="cannot be transposed"):
            jax.hessian(f)(x)
    # d/dx (3 * square(x)) through square's 7x rule: 3 * 7 * 2x
    close(hessian(f, x), np.diag([42.0, 84.0]))
    close(jax.jit(lambda x: hessian(f, x))(x), np.diag([42.0, 84.0]))
    close(hessian_reverse(f, x), np.diag([42.0, 84.0]))
    close(diaghessian(f, x)[0], [42.0, 84.0])


def test_hessian_reverse(maybe_jit):
    H = maybe_jit(lambda x: hessian_reverse(lambda x: x[0] ** 2 * x[1], x))(jnp.array([1.0, 2.0]))
    close(H, [[4.0, 2.0], [2.0, 0.0]])
    assert float(hessian_reverse(jnp.sin, np.pi / 2)) == -1.0


def test_hessian_errors():
    with pytest.raises(GradientError, match="jacobian"):
        hessian(lambda x: x * 2, jnp.ones(2))
    with pytest.raises(GradientError, match="real"):
        hessian(lambda z: jnp.abs(z) ** 2, 1.0 + 1j)
    with pytest.raises(GradientError, match="float array"):
        hessian(lambda x: x, "x")


# ----- diaghessian ------------------------------------------------------------------------------
def test_diaghessian_zygote_examples():
    (h,) = diaghessian(lambda x: jnp.sum(x**3), jnp.array([[1.0, 2.0], [3.0, 4.0]]))
    close(h, [[6.0, 12.0], [18.0, 24.0]])
    hx, hy = diaghessian(
        lambda x, y: jnp.sum(x * y * y.T), jnp.array([[1.0, 22.0], [333.0, 4.0]]), jnp.array([[0.5, 0.666]])
    )
    close(hx, np.zeros((2, 2)))
    close(hy, [[2.0, 8.0]])


def test_diaghessian_non_differentiable_arguments_and_scalars(maybe_jit):
    h = maybe_jit(lambda x: diaghessian(lambda x, a, name: jnp.sum(x**3) * a**2, x, 2.0, "n"))(jnp.array([1.0, 2.0]))
    close(h[0], [24.0, 48.0])
    close(h[1], 2 * 9.0)
    assert h[2] is None


def test_diaghessian_int_index_gets_none():
    h = diaghessian(lambda x, i: x[i] ** 3, jnp.array([1.0, 2.0]), 1)
    close(h[0], [0.0, 12.0])
    assert h[1] is None


def test_diaghessian_int_arguments():
    # f sees the int as it is (x**0 is integer_pow; promoted, pow's derivatives are NaN at
    # 0), and once more promoted, for the int's own second derivative.
    h = diaghessian(lambda x, n: x**n, 0.0, 0)
    assert h[0] == 0.0
    assert diaghessian(lambda x, n: x**3 * n**2, 2.0, 3) == (108.0, 16.0)
    h = diaghessian(lambda x, n: jnp.sum(jnp.repeat(x, n) ** 2), jnp.arange(5.0), 4)
    close(h[0], np.full(5, 8.0))
    assert h[1] is None


# ----- forward_jacobian -------------------------------------------------------------------------
def test_forward_jacobian_is_transposed(maybe_jit):
    def f(x):
        return jnp.array([x[0] * x[1], x[1] ** 2, x[0]])

    x = jnp.array([2.0, 3.0])
    y, J = maybe_jit(lambda x: forward_jacobian(f, x))(x)
    close(y, [6.0, 9.0, 2.0])
    assert J.shape == (2, 3)
    close(J, np.asarray(zygote_jax.jacobian(f, x)[0]).T)


def test_forward_jacobian_scalar_cases():
    y, J = forward_jacobian(jnp.sum, jnp.array([1.0, 2.0]))
    assert float(y) == 3.0 and J.shape == (2, 1)
    y, J = forward_jacobian(lambda x: jnp.array([x, x**2]), 2.0)
    close(J, [[1.0, 4.0]])


def test_forward_jacobian_needs_forward_mode():
    cube = _rrule_only("cube_fj", lambda x: x**3, lambda x: 3 * x**2, scale=7)
    close(forward_jacobian(cube, jnp.ones(2))[1], 7 * 3 * np.eye(2))  # the transposed pullback
    stuck = _rrule_only("cube_fj_loop", lambda x: x**3, lambda x: 3 * x**2, scale=1, transposable=False)
    with pytest.raises(rules.ForwardModeError):
        forward_jacobian(stuck, jnp.ones(2))
    with pytest.raises(GradientError, match="array"):
        forward_jacobian(lambda x: (x, x), 1.0)


# ----- forwarddiff ------------------------------------------------------------------------------
def test_forwarddiff_value_and_gradient(maybe_jit):
    assert float(forwarddiff(jnp.sin, 0.5)) == float(jnp.sin(0.5))
    g = maybe_jit(lambda x: gradient(lambda x: jnp.sum(forwarddiff(lambda u: jnp.sin(u) * u[::-1], x)), x)[0])(
        jnp.array([1.0, 2.0])
    )
    expected = gradient(lambda x: jnp.sum(jnp.sin(x) * x[::-1]), jnp.array([1.0, 2.0]))[0]
    close(g, expected)


def test_forwarddiff_computes_the_derivative_in_forward_mode():
    # An rrule-only primitive whose pullback JAX cannot transpose has no forward mode:
    # reverse mode works, forwarddiff does not.
    cube = _rrule_only("cube_fd", lambda x: x**3, lambda x: 3 * x**2, scale=1, transposable=False)
    assert gradient(cube, 2.0) == (12.0,)
    assert float(forwarddiff(cube, 2.0)) == 8.0  # the value alone needs no derivative
    with pytest.raises(rules.ForwardModeError):
        gradient(lambda x: forwarddiff(cube, x), 2.0)
    with pytest.raises(rules.ForwardModeError):  # f closes over a differentiated value (run from a jaxpr)
        gradient(lambda w: forwarddiff(lambda u: cube(u) * w, 2.0), 3.0)
    cube7 = _rrule_only("cube_fd7", lambda x: x**3, lambda x: 3 * x**2, scale=7)  # transposable
    assert gradient(lambda x: forwarddiff(cube7, x), 2.0) == (7 * 12.0,)


def test_forwarddiff_differentiates_the_values_f_closes_over(maybe_jit):
    # it raised JAX's UnexpectedTracerError (a custom_jvp's function closing over a tracer);
    # Zygote's forwarddiff drops these gradients: here they are right, in both modes
    def loss(w, x):
        return jnp.sum(forwarddiff(lambda u: jnp.sin(u) * w[0] + u * w[1] ** 2, x))

    def plain(w, x):
        return jnp.sum(jnp.sin(x) * w[0] + x * w[1] ** 2)

    w, x = jnp.array([1.5, -2.0]), jnp.array([0.3, 0.7, 1.1])
    for got, want in zip(maybe_jit(lambda w, x: gradient(loss, w, x))(w, x), gradient(plain, w, x)):
        close(got, want)
    close(jax.jvp(lambda w: loss(w, x), (w,), (jnp.array([1.0, 0.5]),))[1],
          jax.jvp(lambda w: plain(w, x), (w,), (jnp.array([1.0, 0.5]),))[1])


def test_forwarddiff_under_jvp_and_matrix_shapes():
    y, y_dot = jax.jvp(lambda x: forwarddiff(lambda u: u @ u, x), (jnp.eye(2),), (jnp.ones((2, 2)),))
    close(y, np.eye(2))
    close(y_dot, 2 * np.ones((2, 2)))
    assert gradient(lambda x: forwarddiff(lambda u: u**2, x), 3) == (6.0,)
