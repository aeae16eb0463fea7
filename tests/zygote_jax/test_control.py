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


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_hook_returning_none_is_an_error(jit):
    def f(x):
        return jnp.sum(hook(lambda g: None, x) ** 2)  # e.g. `lambda g: print(g)`

    grad = jax.jit(lambda x: gradient(f, x)) if jit else (lambda x: gradient(f, x))
    fix = r"\(print\(g\), g\)\[1\]"
    with pytest.raises(GradientError, match=r"(?s)`hook\(.*returned None.*must return the gradient.*" + fix):
        grad(jnp.ones(2))


@pytest.mark.parametrize(
    "x, fn",
    [
        ({"a": 1.0}, lambda g: (g,)),
        ({"a": 1.0, "b": 2.0}, lambda g: {"a": g["a"]}),
        ({"a": 1.0}, lambda g: {"a": None}),
        (jnp.ones(2), lambda g: [g, g]),
    ],
    ids=["tuple-for-dict", "missing-key", "none-leaf", "list-for-array"],
)
def test_hook_changing_the_structure_is_an_error(x, fn):
    def f(x):
        return sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(hook(fn, x)))

    with pytest.raises(GradientError, match=r"(?s)`hook\(.*structure.*expected: PyTreeDef"):
        gradient(f, x)


def test_hook_complex_gradient_for_a_real_x_is_an_error():
    with pytest.raises(GradientError, match=r"(?s)`hook\(.*complex gradient at \['a'\] for a real x.*jnp.real"):
        gradient(lambda p: jnp.sum(hook(lambda g: {"a": g["a"] * 1j}, p)["a"]), {"a": jnp.ones(2)})


def test_hook_result_takes_the_dtype_of_the_gradient():
    x = jnp.ones(2, jnp.float32)
    (g,) = gradient(lambda x: jnp.sum(hook(lambda g: g * jnp.array(2.0, jnp.float64), x)), x)
    assert g.dtype == jnp.float32
    close(g, [2.0, 2.0])
    (g,) = gradient(lambda x: jnp.sum(hook(lambda g: jnp.full(2, 3), x)), jnp.ones(2))  # ints are fine
    assert g.dtype == jnp.float64
    close(g, [3.0, 3.0])


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


# Out-of-bounds reads and writes raise (JAX would clamp or drop them); negative indices count
# from the end, as in Python.
def write(buf, index, value):
    buf[index] = value
    return buf.copy()


@pytest.mark.parametrize(
    "index, reason",
    [
        (3, "index 3 is out of bounds for axis 0 with size 3"),
        (-4, "index -4 is out of bounds for axis 0 with size 3"),
        ((0, 0), "too many indices"),
        (np.array([0, 3]), "index 3 is out of bounds"),
        (jnp.array([0, -4]), "index -4 is out of bounds"),
    ],
    ids=["int", "negative", "too-many", "numpy", "jax"],
)
def test_buffer_out_of_bounds_is_an_index_error(maybe_jit, index, reason):
    x = jnp.zeros(3)
    with pytest.raises(IndexError, match=r"(?s)`Buffer`: cannot write at index .* shape \(3,\).*" + reason) as err:
        maybe_jit(lambda x: write(Buffer(x), index, 1.0))(x)
    assert isinstance(err.value, GradientError) and "dropped this write" in str(err.value)
    with pytest.raises(IndexError, match=r"(?s)`Buffer`: cannot read at index .*" + reason) as err:
        maybe_jit(lambda x: Buffer(x)[index])(x)
    assert "clamped this read" in str(err.value)


def test_buffer_negative_indices_count_from_the_end(maybe_jit):
    def f(x):
        buf = Buffer(jnp.zeros((2, 3)))
        buf[-1, -1] = x
        buf[0, -3] = buf[-1, 2] * 2
        return buf.copy()

    close(maybe_jit(f)(1.0), [[2.0, 0.0, 0.0], [0.0, 0.0, 1.0]])


def test_buffer_iterates_and_stops_at_its_end():
    it = iter(Buffer(jnp.array([1.0, 2.0])))  # Python iterates by __getitem__ until IndexError
    assert [float(next(it)) for _ in range(2)] == [1.0, 2.0]
    with pytest.raises(StopIteration):
        next(it)


def fill_in_a_loop(x, n):  # a traced index: `i` is a tracer in the loop body
    def body(i, buf):
        buf[i] = x[i % 3] * buf[i - 1]
        return buf

    return jax.lax.fori_loop(0, n, body, Buffer(jnp.ones(3))).copy()


def test_buffer_traced_indices_in_bounds(maybe_jit):
    x = jnp.array([1.0, 2.0, 3.0])
    close(maybe_jit(fill_in_a_loop)(x, 3), [1.0, 2.0, 6.0])
    close(maybe_jit(lambda x: gradient(lambda x: jnp.sum(fill_in_a_loop(x, 3)), x))(x)[0], [9.0, 4.0, 2.0])
    at = jnp.array([0, -1])
    close(jax.jit(jax.vmap(lambda i: write(Buffer(jnp.zeros(2)), i, 1.0)))(at), [[1.0, 0.0], [0.0, 1.0]])


def test_buffer_traced_index_out_of_bounds_raises_as_the_program_runs():
    x = jnp.array([1.0, 2.0, 3.0])
    message = r"(?s)`Buffer`: cannot write at index 3 of a buffer of shape \(3,\) \(a traced index.*out of bounds"
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.block_until_ready(jax.jit(fill_in_a_loop, static_argnums=1)(x, 4))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"(?s)cannot read at index \(1, -3\) .*axis 1 with size 2"):
        jax.block_until_ready(jax.jit(lambda i, j: Buffer(jnp.zeros((2, 2)))[i, j])(1, -3))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"(?s)cannot write at index array\(\[0, 2\]\)"):
        jax.block_until_ready(jax.jit(lambda i: write(Buffer(jnp.zeros(2)), i, 1.0))(jnp.array([0, 2])))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"(?s)cannot write at index 2 "):
        jax.block_until_ready(jax.jit(jax.vmap(lambda i: write(Buffer(jnp.zeros(2)), i, 1.0)))(jnp.array([0, 2])))


# A written value keeps its value: Python numbers must fit, arrays must promote to the dtype.
@pytest.mark.parametrize(
    "dtype, value, expected",
    [
        (jnp.float64, 1 + 2j, "a real number"),
        (jnp.float64, jnp.array(1 + 2j), "promotes to float64"),
        (jnp.int32, 1.7, "an integer"),
        (jnp.int32, jnp.array(2.0), "promotes to int32"),
        (jnp.int8, 300, r"a number in \[-128, 127\]"),
        (jnp.uint8, jnp.array(-1), r"a number in \[0, 255\]"),  # weakly typed: checked as an int is
        (jnp.float32, jnp.array(0.5, jnp.float64), "promotes to float32"),
    ],
    ids=["complex-into-real", "complex-array", "fraction-into-int", "float-array", "overflow", "weak-overflow",
         "f64-in-f32"],
)
def test_buffer_write_that_would_change_the_value_is_a_type_error(maybe_jit, dtype, value, expected):
    what = r"(?s)`Buffer`: cannot write .* at index 0 into a buffer of dtype .*"
    with pytest.raises(TypeError, match=what + expected) as err:
        maybe_jit(lambda b: write(b, 0, value))(Buffer(jnp.zeros(2, dtype)))
    assert isinstance(err.value, GradientError)


@pytest.mark.parametrize(
    "dtype, value, stored",
    [
        (jnp.float64, 2, 2.0),
        (jnp.float64, jnp.array(2, jnp.int32), 2.0),
        (jnp.float64, jnp.array(0.5, jnp.float32), 0.5),
        (jnp.float64, 1 + 0j, 1.0),
        (jnp.float32, 0.1, np.float32(0.1)),
        (jnp.int32, 2.0, 2),
        (jnp.int8, -128, -128),
        (jnp.int8, jnp.array(-128), -128),
        (jnp.complex64, 1.5, 1.5),
        (jnp.bool_, 1, True),
    ],
)
def test_buffer_write_of_a_value_that_fits(maybe_jit, dtype, value, stored):
    out = maybe_jit(lambda b: write(b, 0, value))(Buffer(jnp.zeros(2, dtype)))
    assert out.dtype == dtype and out[0] == stored


def test_buffer_write_of_a_traced_weak_integer_is_checked_as_the_program_runs():
    """A Python int passed to `jax.jit` is a weakly typed tracer: it takes the buffer's dtype
    as the int would, so it must fit as the int must (JAX alone would wrap 300 to 44)."""
    def scaled(n):
        buf = Buffer(jnp.zeros(2, jnp.int8))
        buf[0] = n * 100
        return buf.copy()

    assert list(jax.jit(scaled)(1)) == [100, 0]
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"(?s)cannot write 300 at index 0 .* dtype int8"):
        jax.block_until_ready(jax.jit(scaled)(3))


def test_buffer_write_of_the_wrong_shape_names_buffer(maybe_jit):
    what = r"(?s)`Buffer`: cannot write a value of shape \(3,\) at index slice\(0, 2, None\).*shape \(2,\)"
    with pytest.raises(ValueError, match=what):
        maybe_jit(lambda b: write(b, slice(0, 2), jnp.ones(3)))(Buffer(jnp.zeros(3)))
    with pytest.raises(GradientError, match=r"value of shape \(1, 3\)"):  # no extra leading axes, as in JAX
        maybe_jit(lambda b: write(b, 0, jnp.ones((1, 3))))(Buffer(jnp.zeros((2, 3))))
    close(maybe_jit(lambda b: write(b, (slice(None), 0), jnp.ones(1)))(Buffer(jnp.zeros((2, 3))))[:, 0], [1.0, 1.0])
