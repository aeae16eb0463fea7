"""dropgrad, ignore_derivatives, hook, checkpointed, isderiving, Buffer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zygote_jax
from zygote_jax import Buffer, GradientError, checkpointed, dropgrad, gradient, hook, ignore_derivatives, isderiving


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def maybe_jit(request):
    return jax.jit if request.param else (lambda fn: fn)


# ----- dropgrad / ignore_derivatives ------------------------------------------------------------
def test_dropgrad(maybe_jit):
    g = maybe_jit(lambda a, b: gradient(lambda a, b: dropgrad(a) * b + a, a, b))(2.0, 3.0)
    assert g == (1.0, 2.0)
    tree = {"w": jnp.ones(2), "n": 3, "s": "s"}
    assert dropgrad(tree)["s"] == "s"
    close(gradient(lambda p: jnp.sum(dropgrad(p)["w"] * p["w"]), tree)[0]["w"], [1.0, 1.0])


def test_ignore_derivatives_value_and_thunk():
    assert ignore_derivatives is __import__("rules").ignore_derivatives
    assert gradient(lambda x: x * ignore_derivatives(x), 3.0) == (3.0,)
    assert gradient(lambda x: ignore_derivatives(lambda: x**2) + x, 3.0) == (1.0,)


# ----- hook -------------------------------------------------------------------------------------
def test_hook_negates(maybe_jit):
    g = maybe_jit(lambda a, b: gradient(lambda a, b: hook(lambda g: -g, a) * b, a, b))(2.0, 3.0)
    assert g == (-3.0, 2.0)


def test_hook_sees_the_gradient_and_is_identity_forward():
    seen = []
    assert float(hook(lambda g: g, 2.0)) == 2.0
    g = gradient(lambda x: jnp.sum(hook(lambda g: seen.append(g) or g, x) ** 2), jnp.array([1.0, 2.0]))
    close(seen[0], [2.0, 4.0])
    close(g[0], [2.0, 4.0])


def test_hook_on_a_pytree_and_complex_convention():
    def doubled(t):
        return {k: 2 * v for k, v in t.items()}

    def f(p):
        q = hook(doubled, p)
        return q["a"] * q["b"]

    assert gradient(f, {"a": 2.0, "b": 3.0}) == ({"a": 6.0, "b": 4.0},)
    # the hook sees ChainRules' cotangent (conjugate of JAX's), as `gradient` returns it
    seen = []
    g = gradient(lambda z: jnp.abs(hook(lambda t: seen.append(t) or t, z)) ** 2, 1.0 + 2.0j)
    assert complex(seen[0]) == 2 + 4j and g == (2 + 4j,)


def test_hook_shape_change_is_an_error():
    with pytest.raises(GradientError, match="shape"):
        gradient(lambda x: jnp.sum(hook(jnp.sum, x)), jnp.ones(3))


# ----- checkpointed -----------------------------------------------------------------------------
def test_checkpointed_equal_result_and_gradient(maybe_jit):
    def block(x, w, n):
        for _ in range(n):
            x = jnp.tanh(w * x)
        return jnp.sum(x)

    x, w = jnp.array([0.1, 0.2]), 1.5
    plain = maybe_jit(lambda x, w: gradient(lambda x, w: block(x, w, 3), x, w))(x, w)
    ckpt = maybe_jit(lambda x, w: gradient(lambda x, w: checkpointed(block, x, w, 3), x, w))(x, w)
    close(ckpt[0], plain[0])
    close(ckpt[1], plain[1])
    assert float(checkpointed(block, x, w, 3)) == float(block(x, w, 3))


def test_checkpointed_uses_jax_checkpoint():
    jaxpr = jax.make_jaxpr(lambda x: gradient(lambda x: checkpointed(jnp.sin, x), x))(1.0)
    assert "checkpoint" in str(jaxpr) or "remat" in str(jaxpr)


def test_checkpointed_stores_less_for_the_backward_pass():
    def block(x):
        for _ in range(5):
            x = jnp.tanh(jnp.sin(x) * 1.5)
        return jnp.sum(x)

    def stored(f, x):  # the residuals a pullback keeps alive
        return sum(leaf.size for leaf in jax.tree_util.tree_leaves(jax.vjp(f, x)[1]))

    x = jnp.ones(100)
    assert stored(lambda x: checkpointed(block, x), x) <= stored(block, x) / 5


# ----- isderiving -------------------------------------------------------------------------------
def test_isderiving():
    seen = []

    def f(x):
        seen.append(isderiving())
        return jnp.sum(x**2)

    x = jnp.ones(2)
    f(x)
    jax.grad(f)(x)
    assert seen == [False, False]
    seen.clear()
    gradient(f, x)
    zygote_jax.pullback(f, x)
    zygote_jax.jacobian(f, x)
    zygote_jax.hessian(f, x)
    jax.jit(lambda x: gradient(f, x))(x)
    assert seen and all(seen)
    assert not isderiving()


def test_isderiving_is_reset_after_an_error():
    with pytest.raises(ZeroDivisionError):
        gradient(lambda x: 1 / 0, 1.0)
    assert not isderiving()


# ----- Buffer -----------------------------------------------------------------------------------
def vstack_with_buffer(xs):
    buf = Buffer(xs, len(xs), 5)
    for i in range(len(xs)):
        buf[i, :] = xs[i]
    return buf.copy()


def test_buffer_vstack_example(maybe_jit):
    x = jnp.array([1.0, 2.0, 3.0])
    close(maybe_jit(vstack_with_buffer)(x), np.repeat(np.asarray(x)[:, None], 5, axis=1))
    g = maybe_jit(lambda x: gradient(lambda x: jnp.sum(vstack_with_buffer(x)), x))(x)
    close(g[0], [5.0, 5.0, 5.0])


def test_buffer_writes_reads_and_copy(maybe_jit):
    def f(x):
        buf = Buffer(jnp.zeros(3))
        buf[0] = x
        buf[1] = buf[0] * 2
        buf[2] += x**2
        return jnp.sum(buf.copy() * jnp.array([1.0, 10.0, 100.0]))

    assert float(maybe_jit(f)(2.0)) == 2 + 40 + 400
    assert maybe_jit(lambda x: gradient(f, x))(2.0) == (1 + 20 + 400.0,)


def test_buffer_is_frozen_after_copy_and_is_a_pytree():
    buf = Buffer(jnp.zeros((2, 3)))
    assert buf.shape == (2, 3) and buf.dtype == jnp.float64 and len(buf) == 2
    y = buf.copy()
    with pytest.raises(GradientError, match="copy"):
        buf[0, 0] = 1.0
    assert "frozen" in repr(buf)
    close(y, np.zeros((2, 3)))
    out = jax.jit(lambda b: b)(Buffer(jnp.ones(2)))
    assert isinstance(out, Buffer)
    close(out.copy(), [1.0, 1.0])
