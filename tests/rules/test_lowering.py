"""Tests for rules/_lowering.py and rules/_primitive.py: rules lowered into custom_vjp/custom_jvp.

Most primitives here carry a rule that is deliberately wrong by a factor of 7: a result of 7x
the true derivative proves that JAX used the rule rather than differentiating the function.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import rules
from rules import AbstractZero, NoTangent, Tangent, Thunk, ZeroTangent
from rules import _dual

# ------------------------------------------------------------------------------------------
# Factories: fresh primitives per test, so registrations never leak between tests
# ------------------------------------------------------------------------------------------


def make_cube_rrule(scale=7.0):
    """cube(x) = x**3 with an rrule whose derivative is `scale * 3 x**2`."""

    @rules.primitive
    def cube(x):
        return x**3

    @cube.rrule
    def cube_rrule(x):
        def cube_pullback(y_bar):
            return NoTangent(), y_bar * scale * 3 * x**2

        return cube(x), cube_pullback

    return cube


def make_cube_frule(scale=7.0):
    """cube(x) = x**3 with only an frule, whose derivative is `scale * 3 x**2`."""

    @rules.primitive
    def cube(x):
        return x**3

    @cube.frule
    def cube_frule(tangents, x):
        _, x_dot = tangents
        return cube(x), scale * 3 * x**2 * x_dot

    return cube


def sum_of(prim):
    return lambda x: jnp.sum(prim(x))


X = jnp.array([0.5, -1.0, 2.0])


# ------------------------------------------------------------------------------------------
# The rule is used
# ------------------------------------------------------------------------------------------


def test_rrule_is_used_by_grad(maybe_jit):
    cube = make_cube_rrule()
    assert float(maybe_jit(jax.grad(cube))(2.0)) == pytest.approx(7 * 12.0)
    np.testing.assert_allclose(maybe_jit(jax.grad(sum_of(cube)))(X), 7 * 3 * X**2)


def test_rrule_is_used_by_vmap_of_grad_and_batched_equals_looped(maybe_jit):
    cube = make_cube_rrule()
    xs = jnp.array([0.5, -1.0, 2.0, 3.0])
    batched = maybe_jit(jax.vmap(jax.grad(cube)))(xs)
    looped = jnp.stack([jax.grad(cube)(x) for x in xs])
    np.testing.assert_allclose(batched, looped)
    np.testing.assert_allclose(batched, 7 * 3 * xs**2)


def test_frule_only_is_used_by_jvp_and_by_grad_through_transposition(maybe_jit):
    cube = make_cube_frule()
    y, y_dot = maybe_jit(lambda x, t: jax.jvp(cube, (x,), (t,)))(X, jnp.ones(3))
    np.testing.assert_allclose(y, X**3)
    np.testing.assert_allclose(y_dot, 7 * 3 * X**2)
    np.testing.assert_allclose(maybe_jit(jax.grad(sum_of(cube)))(X), 7 * 3 * X**2)
    batched = jax.vmap(jax.grad(cube))(X)
    np.testing.assert_allclose(batched, 7 * 3 * X**2)


def test_redefining_the_rrule_changes_the_next_result(maybe_jit):
    cube = make_cube_rrule()
    g = maybe_jit(jax.grad(cube))
    assert float(g(2.0)) == pytest.approx(84.0)

    @cube.rrule
    def cube_rrule_true(x):
        def cube_pullback(y_bar):
            return NoTangent(), y_bar * 3 * x**2

        return cube(x), cube_pullback

    assert float(g(2.0)) == pytest.approx(12.0)  # same function object, same shapes


def test_redefining_the_frule_changes_the_next_result(maybe_jit):
    cube = make_cube_frule()
    f = maybe_jit(lambda x: jax.jvp(cube, (x,), (1.0,))[1])
    assert float(f(2.0)) == pytest.approx(84.0)

    @cube.frule
    def cube_frule_true(tangents, x):
        return cube(x), 3 * x**2 * tangents[1]

    assert float(f(2.0)) == pytest.approx(12.0)


# ------------------------------------------------------------------------------------------
# Eager calls run the function directly; traced calls go through custom_vjp / custom_jvp
# ------------------------------------------------------------------------------------------


def test_eager_call_runs_the_function_directly_and_not_the_rule():
    calls = []

    @rules.primitive
    def double(x):
        calls.append("fn")
        return 2 * x

    @double.rrule
    def double_rrule(x):
        calls.append("rule")
        return double(x), lambda y_bar: (NoTangent(), 2 * y_bar)

    y = double(jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(y, [2.0, 4.0])
    assert calls == ["fn"]
    assert len(double._lowered) == 0  # no lowering (no custom_vjp) was built


def test_traced_call_lowers_rrule_to_one_primitive_and_frule_to_custom_jvp():
    text = str(jax.make_jaxpr(make_cube_rrule())(2.0))
    if _dual.ENABLED:  # one primitive that keeps its rules (test_dual_mode.py)
        assert "rules_call[op=rulescall[" in text and "custom_vjp_call" not in text
    else:
        assert "custom_vjp_call" in text
    text = str(jax.make_jaxpr(make_cube_frule())(2.0))
    assert "custom_jvp_call" in text and "custom_vjp_call" not in text and "rules_call" not in text


def test_primitive_without_rules_is_differentiated_by_jax(maybe_jit):
    @rules.primitive
    def plain(x):
        return jnp.sin(x)

    assert float(maybe_jit(jax.grad(plain))(0.3)) == pytest.approx(np.cos(0.3))
    assert "custom_" not in str(jax.make_jaxpr(plain)(0.3))


# ------------------------------------------------------------------------------------------
# Complex numbers: ChainRules convention in the rule, JAX's at the boundary
# ------------------------------------------------------------------------------------------


def make_complex_square():
    @rules.primitive
    def csquare(z):
        return z * z

    @csquare.rrule
    def csquare_rrule(z):
        def csquare_pullback(y_bar):
            return NoTangent(), y_bar * jnp.conj(2 * z)

        return csquare(z), csquare_pullback

    return csquare


def test_complex_rrule_gives_jax_native_vjp(maybe_jit):
    csquare = make_complex_square()
    z = jnp.array([1.0 + 2.0j, -0.5 + 0.25j, 3.0 - 1.0j])
    seed = jnp.array([0.3 - 1.1j, 2.0 + 0.5j, -1.0 + 1.0j])
    ours = maybe_jit(lambda z, s: jax.vjp(csquare, z)[1](s)[0])(z, seed)
    native = jax.vjp(lambda z: z * z, z)[1](seed)[0]
    np.testing.assert_allclose(ours, native, rtol=1e-14)
    assert ours.dtype == jnp.complex128


def test_complex_rrule_grad_of_abs_equals_native(maybe_jit):
    csquare = make_complex_square()
    z = 1.0 + 2.0j
    ours = maybe_jit(jax.grad(lambda z: jnp.abs(csquare(z))))(z)
    native = jax.grad(lambda z: jnp.abs(z * z))(z)
    np.testing.assert_allclose(ours, native, rtol=1e-14)
    assert ours != jnp.conj(native)  # the check is sensitive to a missing conj


# ------------------------------------------------------------------------------------------
# Symbolic zeros and thunks
# ------------------------------------------------------------------------------------------


def make_sincos(seen):
    @rules.primitive
    def sincos(x):
        return jnp.sin(x), jnp.cos(x)

    @sincos.rrule
    def sincos_rrule(x):
        s, c = sincos(x)

        def sincos_pullback(y_bar):
            s_bar, c_bar = y_bar
            seen.append((isinstance(s_bar, ZeroTangent), isinstance(c_bar, ZeroTangent)))
            x_bar = ZeroTangent()
            if not isinstance(s_bar, AbstractZero):
                x_bar = x_bar + s_bar * c
            if not isinstance(c_bar, AbstractZero):
                x_bar = x_bar - c_bar * s
            return NoTangent(), x_bar

        return (s, c), sincos_pullback

    return sincos


LOSSES = {
    "first": (lambda out: out[0], lambda x: np.cos(x), (False, True)),
    "second": (lambda out: out[1], lambda x: -np.sin(x), (True, False)),
    "both": (lambda out: out[0] + out[1], lambda x: np.cos(x) - np.sin(x), (False, False)),
}


@pytest.mark.parametrize("which", list(LOSSES))
def test_unused_outputs_reach_the_pullback_as_zero_tangent_eager(which):
    pick, expected, pattern = LOSSES[which]
    seen = []
    sincos = make_sincos(seen)
    assert float(jax.grad(lambda x: pick(sincos(x)))(0.7)) == pytest.approx(expected(0.7))
    assert seen == [pattern]


@pytest.mark.parametrize("which", list(LOSSES))
def test_symbolic_zero_patterns_give_correct_gradients_under_jit(which):
    pick, expected, pattern = LOSSES[which]
    seen = []
    sincos = make_sincos(seen)
    assert float(jax.jit(jax.grad(lambda x: pick(sincos(x))))(0.7)) == pytest.approx(expected(0.7))
    # under a trace too, the pullback is traced once, with the pattern that occurs
    assert seen == [pattern]


def test_more_than_three_outputs_with_partly_unused_cotangents(maybe_jit):
    @rules.primitive
    def multiples(x):
        return x, 2 * x, 3 * x, 4 * x

    @multiples.rrule
    def multiples_rrule(x):
        def multiples_pullback(y_bar):
            x_bar = ZeroTangent()
            for c, g in zip((1, 2, 3, 4), y_bar):
                if not isinstance(g, AbstractZero):
                    x_bar = x_bar + 7 * c * g
            return NoTangent(), x_bar

        return multiples(x), multiples_pullback

    def loss(x):
        out = multiples(x)
        return jnp.sum(out[1] + out[3])

    np.testing.assert_allclose(maybe_jit(jax.grad(loss))(X), 7 * 6 * np.ones(3))
    np.testing.assert_allclose(maybe_jit(jax.grad(lambda x: jnp.sum(multiples(x)[2])))(X), 21 * np.ones(3))


def make_recording_mul(evaluated):
    @rules.primitive
    def mul(a, b):
        return a * b

    @mul.rrule
    def mul_rrule(a, b):
        def mul_pullback(y_bar):
            def a_bar():
                evaluated.append("a")
                return y_bar * b

            def b_bar():
                evaluated.append("b")
                return y_bar * a

            return NoTangent(), Thunk(a_bar), Thunk(b_bar)

        return mul(a, b), mul_pullback

    return mul


@pytest.mark.parametrize("argnums, expected", [(0, ["a"]), (1, ["b"])])
def test_thunks_of_unperturbed_inputs_are_never_evaluated(maybe_jit, argnums, expected):
    evaluated = []
    mul = make_recording_mul(evaluated)
    g = maybe_jit(jax.grad(mul, argnums=argnums))(2.0, 3.0)
    assert float(g) == (3.0 if argnums == 0 else 2.0)
    assert evaluated == expected


def test_thunks_of_all_perturbed_inputs_are_evaluated():
    evaluated = []
    mul = make_recording_mul(evaluated)
    assert jax.grad(mul, argnums=(0, 1))(2.0, 3.0) == (3.0, 2.0)
    assert sorted(evaluated) == ["a", "b"]


# ------------------------------------------------------------------------------------------
# Pytrees, non-differentiable and static arguments
# ------------------------------------------------------------------------------------------


class Params(NamedTuple):
    w: jax.Array
    b: jax.Array


W = jnp.array([1.0, 2.0, 3.0])
B = jnp.array([0.5, -0.5, 1.5])


def make_affine(make_cotangent):
    """affine(p, x) = sum(p.w * x + p.b) (p a dict or Params); the rule's cotangent for p is
    `make_cotangent(p, x, y_bar)`."""

    def get(p, k):
        return p[k] if isinstance(p, dict) else getattr(p, k)

    @rules.primitive
    def affine(p, x):
        return jnp.sum(get(p, "w") * x + get(p, "b"))

    @affine.rrule
    def affine_rrule(p, x):
        def affine_pullback(y_bar):
            return NoTangent(), make_cotangent(p, x, y_bar), y_bar * get(p, "w")

        return affine(p, x), affine_pullback

    return affine


def test_tangent_of_dict_becomes_dict_and_missing_fields_are_zeros(maybe_jit):
    affine = make_affine(lambda p, x, y_bar: Tangent(dict, {"w": 7 * y_bar * x}))
    p, x = {"w": W, "b": B}, jnp.array([1.0, -2.0, 0.5])
    g = maybe_jit(jax.grad(affine))(p, x)
    assert set(g) == {"w", "b"}
    np.testing.assert_allclose(g["w"], 7 * x)
    np.testing.assert_array_equal(g["b"], jnp.zeros(3))


def test_tangent_of_namedtuple_becomes_namedtuple(maybe_jit):
    affine = make_affine(lambda p, x, y_bar: Tangent(Params, w=7 * y_bar * x))
    x = jnp.array([1.0, -2.0, 0.5])
    g = maybe_jit(jax.grad(affine))(Params(W, B), x)
    assert isinstance(g, Params)
    np.testing.assert_allclose(g.w, 7 * x)
    np.testing.assert_array_equal(g.b, jnp.zeros(3))


def test_plain_pytree_cotangent_is_accepted(maybe_jit):
    affine = make_affine(lambda p, x, y_bar: {"w": 7 * y_bar * x, "b": 7 * y_bar * jnp.ones(3)})
    x = jnp.array([1.0, -2.0, 0.5])
    gp, gx = maybe_jit(jax.grad(affine, argnums=(0, 1)))({"w": W, "b": B}, x)
    np.testing.assert_allclose(gp["w"], 7 * x)
    np.testing.assert_allclose(gp["b"], 7 * jnp.ones(3))
    np.testing.assert_allclose(gx, W)


def test_pytree_output(maybe_jit):
    @rules.primitive
    def powers(x):
        return {"sq": x**2, "cu": x**3}

    @powers.rrule
    def powers_rrule(x):
        def powers_pullback(y_bar):
            return NoTangent(), 7 * (y_bar["sq"] * 2 * x + y_bar["cu"] * 3 * x**2)

        return powers(x), powers_pullback

    def loss(x):
        out = powers(x)
        return jnp.sum(out["sq"]) + jnp.sum(out["cu"])

    np.testing.assert_allclose(maybe_jit(jax.grad(loss))(X), 7 * (2 * X + 3 * X**2))
    np.testing.assert_allclose(maybe_jit(jax.grad(lambda x: jnp.sum(powers(x)["cu"])))(X), 7 * 3 * X**2)


def make_gather():
    @rules.primitive
    def gather_sum(x, idx, mask):
        return jnp.sum(jnp.where(mask, x[idx], 0.0))

    @gather_sum.rrule
    def gather_sum_rrule(x, idx, mask):
        def gather_sum_pullback(y_bar):
            x_bar = jnp.zeros_like(x).at[idx].add(jnp.where(mask, 7 * y_bar, 0.0))
            # a (wrong) float cotangent for the int argument is dropped, never handed to JAX
            return NoTangent(), x_bar, jnp.ones(idx.shape), NoTangent()

        return gather_sum(x, idx, mask), gather_sum_pullback

    return gather_sum


def test_int_and_bool_arrays_are_non_differentiable_dynamic_arguments(maybe_jit):
    gather_sum = make_gather()
    x = jnp.array([1.0, 2.0, 3.0, 4.0])
    idx, mask = jnp.array([0, 2, 2]), jnp.array([True, True, False])
    g = maybe_jit(jax.grad(gather_sum))(x, idx, mask)
    np.testing.assert_allclose(g, [7.0, 0.0, 7.0, 0.0])
    # the int/bool arguments are dynamic: new values, no new lowering
    g2 = maybe_jit(jax.grad(gather_sum))(x, jnp.array([1, 1, 3]), jnp.array([True, False, True]))
    np.testing.assert_allclose(g2, [0.0, 7.0, 0.0, 7.0])
    assert len(gather_sum._lowered) == 1


def test_int_and_bool_arguments_get_float0_cotangents_with_allow_int(maybe_jit):
    gather_sum = make_gather()
    x = jnp.array([1.0, 2.0, 3.0, 4.0])
    idx, mask = jnp.array([0, 2, 2]), jnp.array([True, True, False])
    gx, gidx, gmask = maybe_jit(jax.grad(gather_sum, argnums=(0, 1, 2), allow_int=True))(x, idx, mask)
    np.testing.assert_allclose(gx, [7.0, 0.0, 7.0, 0.0])
    assert gidx.dtype == jax.dtypes.float0 and gidx.shape == (3,)
    assert gmask.dtype == jax.dtypes.float0 and gmask.shape == (3,)


def make_apply():
    @rules.primitive
    def apply(x, n, mode, fn, extra):
        assert extra is None
        return fn(x) * n if mode == "scale" else fn(x) + n

    @apply.rrule
    def apply_rrule(x, n, mode, fn, extra):
        y, fn_pullback = jax.vjp(fn, x)

        def apply_pullback(y_bar):
            (x_bar,) = fn_pullback(y_bar * n if mode == "scale" else y_bar)
            return NoTangent(), 7 * x_bar, NoTangent(), NoTangent(), NoTangent(), NoTangent()

        return apply(x, n, mode, fn, extra), apply_pullback

    return apply


def test_python_int_str_callable_none_are_static_and_reuse_the_lowering():
    apply = make_apply()
    g = jax.grad(lambda x: apply(x, 3, "scale", jnp.sin, None))
    assert float(g(0.5)) == pytest.approx(7 * 3 * np.cos(0.5))
    assert float(g(1.5)) == pytest.approx(7 * 3 * np.cos(1.5))
    mode = "".join(["sc", "ale"])  # equal, not identical
    assert float(jax.jit(jax.grad(lambda x: apply(x, 3, mode, jnp.sin, None)))(0.5)) == pytest.approx(
        7 * 3 * np.cos(0.5)
    )
    assert len(apply._lowered) == 1
    assert float(jax.grad(lambda x: apply(x, 3, "shift", jnp.cos, None))(0.5)) == pytest.approx(
        -7 * np.sin(0.5)
    )
    assert float(jax.grad(lambda x: apply(x, 2, "scale", jnp.sin, None))(0.5)) == pytest.approx(
        7 * 2 * np.cos(0.5)
    )
    assert len(apply._lowered) == 3


class Unhashable:
    """Equality without hashing (defining __eq__ sets __hash__ to None)."""

    def __init__(self, k):
        self.k = k

    def __eq__(self, other):
        return isinstance(other, Unhashable) and other.k == self.k


def test_unhashable_static_argument_raises_static_argument_error(maybe_jit):
    @rules.primitive
    def scaled(x, config):
        return x * config.k

    @scaled.rrule
    def scaled_rrule(x, config):
        return scaled(x, config), lambda y_bar: (NoTangent(), y_bar * config.k, NoTangent())

    assert scaled(2.0, Unhashable(3)) == 6.0  # eager calls need no hashing
    with pytest.raises(rules.StaticArgumentError) as err:
        maybe_jit(jax.grad(lambda x: scaled(x, Unhashable(3))))(2.0)
    assert isinstance(err.value, rules.RuleError)
    message = str(err.value)
    assert "scaled" in message and "argument 2 (config)" in message and "Unhashable" in message


# ------------------------------------------------------------------------------------------
# Projection of every cotangent
# ------------------------------------------------------------------------------------------


def make_with_cotangent(make_x_bar):
    @rules.primitive
    def ident(x):
        return x

    @ident.rrule
    def ident_rrule(x):
        return ident(x), lambda y_bar: (NoTangent(), make_x_bar(x, y_bar))

    return ident


def test_float64_cotangent_for_float32_input_is_cast_to_float32(maybe_jit):
    ident = make_with_cotangent(lambda x, y_bar: jnp.asarray(7 * y_bar, jnp.float64))
    x = jnp.array([1.0, 2.0, 3.0], jnp.float32)
    g = maybe_jit(jax.grad(lambda x: jnp.sum(ident(x))))(x)
    assert g.dtype == jnp.float32
    np.testing.assert_allclose(g, 7 * np.ones(3))


def test_complex_cotangent_for_real_input_keeps_the_real_part(maybe_jit):
    ident = make_with_cotangent(lambda x, y_bar: 7 * y_bar + 5j * y_bar)
    g = maybe_jit(jax.grad(lambda x: jnp.sum(ident(x))))(X)
    assert g.dtype == jnp.float64
    np.testing.assert_allclose(g, 7 * np.ones(3))


def test_cotangent_with_trivial_dims_is_reshaped(maybe_jit):
    ident = make_with_cotangent(lambda x, y_bar: 7 * jnp.reshape(y_bar, (1, 3)))
    g = maybe_jit(jax.grad(lambda x: jnp.sum(ident(x))))(X)
    assert g.shape == (3,)
    np.testing.assert_allclose(g, 7 * np.ones(3))


# ------------------------------------------------------------------------------------------
# Composition with JAX transformations
# ------------------------------------------------------------------------------------------


def test_vmap_of_primitive_value_and_grad_batched_equals_looped():
    cube = make_cube_rrule()
    xs = jnp.arange(6.0).reshape(2, 3) - 2.0
    batched = jax.vmap(jax.value_and_grad(sum_of(cube)))(xs)
    looped = [jax.value_and_grad(sum_of(cube))(x) for x in xs]
    np.testing.assert_allclose(batched[0], jnp.stack([v for v, _ in looped]))
    np.testing.assert_allclose(batched[1], jnp.stack([g for _, g in looped]))
    np.testing.assert_allclose(batched[1], 7 * 3 * xs**2)


def test_grad_of_grad_differentiates_the_pullback(maybe_jit):
    cube = make_cube_rrule()  # pullback 7 * 3 x**2, so the second derivative is 42 x
    assert float(maybe_jit(jax.grad(jax.grad(cube)))(2.0)) == pytest.approx(42 * 2.0)


def test_grad_through_scan_uses_the_rule(maybe_jit):
    cube = make_cube_rrule()

    def loss(xs):
        def body(carry, x):
            return carry + cube(x), cube(x)

        total, ys = jax.lax.scan(body, 0.0, xs)
        return total + jnp.sum(ys)

    np.testing.assert_allclose(maybe_jit(jax.grad(loss))(X), 2 * 7 * 3 * X**2)


def test_grad_through_checkpoint_uses_the_rule(maybe_jit):
    cube = make_cube_rrule()
    loss = jax.checkpoint(lambda x: jnp.sum(jnp.sin(cube(x))))
    expected = jnp.cos(X**3) * 7 * 3 * X**2
    np.testing.assert_allclose(maybe_jit(jax.grad(loss))(X), expected)


def test_hessian_forward_over_reverse_through_rrule_only_primitive(maybe_jit):
    cube = make_cube_rrule()
    h = maybe_jit(jax.hessian(sum_of(cube)))(X)
    np.testing.assert_allclose(h, jnp.diag(7 * 6 * X))


# ------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------


def make_bad(name, make_result):
    def fn(x):
        return 2 * x

    fn.__name__ = fn.__qualname__ = name
    prim = rules.primitive(fn)

    @prim.rrule
    def bad_rrule(x):
        return prim(x), lambda y_bar: make_result(x, y_bar)

    return prim


def test_pullback_returning_a_non_tuple_raises_pullback_error(maybe_jit):
    prim = make_bad("returns_array", lambda x, y_bar: 2 * y_bar)
    with pytest.raises(rules.PullbackError) as err:
        maybe_jit(jax.grad(sum_of(prim)))(X)
    message = str(err.value)
    assert isinstance(err.value, rules.RuleError)
    assert "`returns_array`" in message and "tuple" in message
    assert "expected: a tuple of 2 cotangents" in message and "got:" in message


def test_pullback_returning_the_wrong_number_of_cotangents_raises_pullback_error(maybe_jit):
    prim = make_bad("too_many", lambda x, y_bar: (NoTangent(), 2 * y_bar, 2 * y_bar))
    with pytest.raises(rules.PullbackError) as err:
        maybe_jit(jax.grad(sum_of(prim)))(X)
    message = str(err.value)
    assert "`too_many`" in message and "wrong number of cotangents" in message
    assert "expected: 2" in message and "got:      3" in message


def test_unprojectable_cotangent_shape_raises_projection_error(maybe_jit):
    prim = make_bad("wrong_shape", lambda x, y_bar: (NoTangent(), jnp.ones((2,))))
    with pytest.raises(rules.ProjectionError) as err:
        maybe_jit(jax.grad(sum_of(prim)))(X)
    message = str(err.value)
    assert isinstance(err.value, rules.RuleError)
    assert "`wrong_shape`" in message and "argument 1 (x)" in message
    assert "(3,)" in message and "(2,)" in message


def test_projection_error_names_the_pytree_path(maybe_jit):
    def weights_sum(p):
        return jnp.sum(p["w"]) + jnp.sum(p["b"])

    prim = rules.primitive(weights_sum)
    prim.rrule(lambda p: (prim(p), lambda y_bar: (NoTangent(), {"w": jnp.ones(2), "b": jnp.ones(3)})))
    with pytest.raises(rules.ProjectionError) as err:
        maybe_jit(jax.grad(prim))({"w": W, "b": B})
    message = str(err.value)
    assert "weights_sum" in message and "argument 1 (p) at path ['w']" in message
    assert "expected: shape (3,)" in message and "got:      shape (2,)" in message


def test_rrule_returning_none_raises_rule_definition_error(maybe_jit):
    def returns_none(x):
        return 2 * x

    prim = rules.primitive(returns_none)
    prim.rrule(lambda x: None)
    with pytest.raises(rules.RuleDefinitionError) as err:
        maybe_jit(jax.grad(prim))(1.0)
    assert isinstance(err.value, rules.RuleError)
    assert "returns_none" in str(err.value) and "returned None" in str(err.value)


def test_tangent_with_unknown_fields_raises_tangent_structure_error(maybe_jit):
    def weighted(p):
        return jnp.sum(p["w"])

    prim = rules.primitive(weighted)

    @prim.rrule
    def weighted_rrule(p):
        return prim(p), lambda y_bar: (NoTangent(), Tangent(dict, {"w": y_bar, "bogus": y_bar}))

    with pytest.raises(rules.TangentStructureError) as err:
        maybe_jit(jax.grad(prim))({"w": W})
    message = str(err.value)
    assert isinstance(err.value, rules.RuleError)
    assert "weighted" in message and "argument 1 (p)" in message and "bogus" in message


FORWARD_MODES = {
    "jvp": lambda f: jax.jvp(f, (X,), (jnp.ones(3),)),
    "jit_of_jvp": lambda f: jax.jit(lambda x: jax.jvp(f, (x,), (jnp.ones(3),)))(X),
    "jacfwd": lambda f: jax.jacfwd(f)(X),
}


def forward_derivative(mode, f):
    """The derivative `FORWARD_MODES[mode]` computes, as the diagonal (f is elementwise)."""
    out = FORWARD_MODES[mode](f)
    return jnp.diagonal(out) if mode == "jacfwd" else out[1]


@pytest.mark.parametrize("mode", list(FORWARD_MODES))
def test_forward_mode_through_rrule_only_primitive_transposes_its_pullback(mode):
    cube = make_cube_rrule()  # a deliberately 7x pullback: forward mode uses it too
    np.testing.assert_allclose(forward_derivative(mode, cube), 7 * 3 * X**2)


@pytest.mark.parametrize("mode", list(FORWARD_MODES))
def test_a_pullback_jax_cannot_transpose_leaves_no_forward_mode_and_says_why(mode):
    @rules.primitive
    def looped(x):
        return 2 * x

    @looped.rrule
    def looped_rrule(x):
        def looped_pullback(y_bar):  # a while_loop in the pullback: JAX cannot transpose it
            _, x_bar = jax.lax.while_loop(lambda c: c[0] < 1, lambda c: (c[0] + 1, 2 * c[1]), (0, y_bar))
            return NoTangent(), x_bar

        return looped(x), looped_pullback

    np.testing.assert_allclose(jax.grad(sum_of(looped))(X), 2 * np.ones(3))  # reverse mode works
    with pytest.raises(rules.ForwardModeError) as err:
        FORWARD_MODES[mode](looped)
    message = str(err.value)
    assert isinstance(err.value, rules.RuleError)
    assert "looped`" in message and "cannot be transposed" in message and "while_loop" in message
    assert "define an frule (`@looped.frule`)" in message


# Both rules on one primitive, under every transformation: tests/rules/test_dual_mode.py


# ------------------------------------------------------------------------------------------
# external: NumPy/SciPy code through jax.pure_callback
# ------------------------------------------------------------------------------------------


def make_erfcx(vmap_method):
    erfcx = rules.external(
        scipy.special.erfcx,
        lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)),
        vmap_method=vmap_method,
    )

    @erfcx.rrule
    def erfcx_rrule(x):
        y = erfcx(x)

        def erfcx_pullback(y_bar):
            return NoTangent(), y_bar * (2 * x * y - 2 / jnp.sqrt(jnp.pi))

        return y, erfcx_pullback

    return erfcx


def erfcx_derivative(x):
    x = np.asarray(x)
    return 2 * x * scipy.special.erfcx(x) - 2 / np.sqrt(np.pi)


@pytest.mark.parametrize("vmap_method", ["sequential", "expand_dims"])
def test_external_value_grad_and_jit(vmap_method):
    erfcx = make_erfcx(vmap_method)
    np.testing.assert_allclose(erfcx(X), scipy.special.erfcx(np.asarray(X)), rtol=1e-14)
    np.testing.assert_allclose(jax.jit(erfcx)(X), scipy.special.erfcx(np.asarray(X)), rtol=1e-14)
    np.testing.assert_allclose(jax.grad(sum_of(erfcx))(X), erfcx_derivative(X), rtol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.grad(sum_of(erfcx)))(X), erfcx_derivative(X), rtol=1e-12)


@pytest.mark.parametrize("vmap_method", ["sequential", "expand_dims", "broadcast_all"])
def test_external_under_vmap_batched_equals_looped(vmap_method):
    erfcx = make_erfcx(vmap_method)
    xs = jnp.stack([X, X + 0.5])
    np.testing.assert_allclose(jax.vmap(erfcx)(xs), scipy.special.erfcx(np.asarray(xs)), rtol=1e-14)
    batched = jax.jit(jax.vmap(jax.grad(sum_of(erfcx))))(xs)
    np.testing.assert_allclose(batched, erfcx_derivative(xs), rtol=1e-12)
    np.testing.assert_allclose(batched, jnp.stack([jax.grad(sum_of(erfcx))(x) for x in xs]))


def test_external_wrong_result_shape_gives_a_clear_error(maybe_jit):
    def two_values(x):
        return np.zeros(2)

    bad = rules.external(two_values, jax.ShapeDtypeStruct((3,), jnp.float64))
    with pytest.raises(Exception, match="wrong shape") as err:
        jax.block_until_ready(maybe_jit(bad)(X))
    message = str(err.value)
    assert "two_values" in message and "(3,)" in message and "(2,)" in message


def test_external_unknown_vmap_method_is_rejected():
    with pytest.raises(ValueError, match="vmap_method"):
        rules.external(np.sin, jax.ShapeDtypeStruct((3,), jnp.float64), vmap_method="parallel")


# ------------------------------------------------------------------------------------------
# Beyond one device: 8 simulated CPU devices (set by the root conftest), whatever the backend
# ------------------------------------------------------------------------------------------


def mesh_of_8():
    cpus = jax.devices("cpu")  # jax.devices() may be one GPU
    assert len(cpus) == 8, "the root conftest must set jax_num_cpu_devices before JAX starts"
    return jax.make_mesh((8,), ("x",), devices=cpus)


def test_rrule_is_used_under_sharded_jit():
    cube = make_cube_rrule()
    sharding = NamedSharding(mesh_of_8(), P("x"))
    x = jax.device_put(jnp.linspace(-1.0, 2.0, 8), sharding)
    g = jax.jit(jax.grad(sum_of(cube)), in_shardings=sharding, out_shardings=sharding)(x)
    assert g.sharding == sharding
    np.testing.assert_allclose(g, 7 * 3 * np.asarray(x) ** 2)


@pytest.mark.parametrize("check_vma", [True, False])
def test_rrule_is_used_under_shard_map(check_vma):
    # check_vma=True (JAX's default) needs the traced pullback to keep the varying axes type
    cube = make_cube_rrule()
    mesh = mesh_of_8()
    x = jax.device_put(jnp.linspace(-1.0, 2.0, 8), NamedSharding(mesh, P("x")))
    specs = dict(mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=check_vma)
    inner = jax.shard_map(jax.grad(sum_of(cube)), **specs)
    np.testing.assert_allclose(jax.jit(inner)(x), 7 * 3 * x**2)
    outer = jax.grad(lambda x: jnp.sum(jax.shard_map(cube, **specs)(x)))
    np.testing.assert_allclose(jax.jit(outer)(x), 7 * 3 * x**2)


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("name", ["argmax", "isnan", "greater"])
def test_integer_and_bool_outputs_under_shard_map_keep_their_varying_axes(name, check_vma):
    # the zero tangent of an int/bool output is float0, which carries no varying axes: with
    # check_vma=True JAX rejected "float0[3]" for "float0[3]{V:x}"; JAX makes the zero itself now
    f = rules.primitive(getattr(jnp, name))  # rules.library.nondiff's rules
    mesh = mesh_of_8()
    x = jax.device_put(jnp.linspace(-1.0, 2.0, 24), NamedSharding(mesh, P("x")))

    def loss(x):
        out = f(x, 0.5) if name == "greater" else f(x)
        return jnp.sum(jnp.sin(x)) + jnp.sum(out.astype(x.dtype))

    grad = jax.shard_map(jax.grad(loss), mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=check_vma)
    np.testing.assert_allclose(jax.jit(grad)(x), jnp.cos(x), rtol=1e-12)


# ------------------------------------------------------------------------------------------
# Higher order: the rule also differentiates its own forward value
# ------------------------------------------------------------------------------------------


def test_grad_of_grad_uses_the_rule_for_the_rules_own_forward_value():
    square = rules.primitive(lambda x: x * x)

    @square.rrule
    def square_rrule(x):
        return square(x), lambda y_bar: (NoTangent(), 7 * 2 * x * y_bar)

    # d/dx [x * square(x)] = square(x) + x * 14x (rule); d2/dx2 = 14x (rule, via square) + 28x
    second = jax.grad(jax.grad(lambda x: x * square(x)))
    assert float(second(3.0)) == pytest.approx(126.0)
    assert float(jax.jit(second)(3.0)) == pytest.approx(126.0)


def test_grad_of_grad_of_an_external_whose_rule_calls_itself():
    erfcx = make_erfcx("sequential")
    x = 0.7
    # d2/dx2 erfcx = 2 erfcx + 2x erfcx' , erfcx' = 2x erfcx - 2/sqrt(pi)
    d1 = erfcx_derivative(x)
    expected = 2 * scipy.special.erfcx(x) + 2 * x * d1
    assert float(jax.grad(jax.grad(erfcx))(x)) == pytest.approx(float(expected), rel=1e-10)


def test_an_frule_calling_its_own_external_keeps_forward_over_forward():
    cube = rules.external(lambda x: np.asarray(x) ** 3, lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)))

    @cube.frule
    def cube_frule(tangents, x):
        return cube(x), 3 * x**2 * tangents[1]

    assert float(jax.grad(jax.grad(cube))(2.0)) == pytest.approx(12.0)
    assert float(jax.hessian(cube)(2.0)) == pytest.approx(12.0)


def test_an_eager_external_call_does_not_compile(caplog):
    calls = []

    def host(x):
        calls.append(1)
        return np.asarray(x) * 2

    twice = rules.external(host, lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)))
    twice(jnp.ones(3))  # the first call may compile JAX's own conversions once
    caplog.clear()
    with jax.log_compiles(True):
        for _ in range(3):
            out = twice(jnp.ones(3))
    assert isinstance(out, jax.Array) and len(calls) == 4
    assert "Compiling" not in caplog.text  # a pure_callback of a fresh closure compiled every time


def test_python_scalar_keyword_arguments_are_static_under_jit():
    seen = []

    @rules.primitive
    def scaled(x, *, power=2.0):
        seen.append(type(power))
        return x**power

    @scaled.rrule
    def scaled_rrule(x, *, power=2.0):
        return scaled(x, power=power), lambda g: (NoTangent(), g * power * x ** (power - 1))

    assert float(jax.jit(lambda x: scaled(x, power=3.0))(2.0)) == 8.0
    assert float(jax.jit(jax.grad(lambda x: scaled(x, power=3.0)))(2.0)) == 12.0
    assert all(t is float for t in seen)  # never a tracer: bound outside the rule
