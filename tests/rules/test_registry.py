"""Tests for rules/_registry.py and rules/_via_ad.py: the rule tables and rrule/frule_via_ad."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
from rules import NoTangent, frule, rrule

# These tests call rules directly (`rules.rrule(f, ...)`), as ChainRules users do, on plain
# functions: the warning that JAX would not see such rules is tested in test_hardening.py.
pytestmark = pytest.mark.filterwarnings("ignore::rules.PlainFunctionWarning")


def make_function(name="f"):
    """A fresh plain function, so registrations never leak between tests."""

    def f(*args, **kwargs):
        return args[0]

    f.__name__ = f.__qualname__ = name
    return f


def tagged_rrule(tag):
    """An rrule implementation whose output says which registration answered."""

    def impl(*args, **kwargs):
        return tag, lambda y_bar: (NoTangent(),) * (1 + len(args))

    return impl


# ------------------------------------------------------------------------------------------
# Registration and lookup
# ------------------------------------------------------------------------------------------


def test_register_and_call_rrule_and_frule_of_a_plain_function():
    def cube(x):
        return x**3

    @rrule.register(cube)
    def cube_rrule(x):
        def cube_pullback(y_bar):
            return NoTangent(), y_bar * 3 * x**2

        return cube(x), cube_pullback

    @frule.register(cube)
    def cube_frule(tangents, x):
        _, x_dot = tangents
        return cube(x), 3 * x**2 * x_dot

    y, back = rrule(cube, 2.0)
    assert y == 8.0 and back(1.0) == (NoTangent(), 12.0)
    assert frule((NoTangent(), 0.5), cube, 2.0) == (8.0, 6.0)
    assert rrule.lookup(cube, (2.0,)) is cube_rrule
    assert cube in rrule.functions() and cube in frule.functions()


def test_rules_of_a_primitive_register_on_the_wrapped_function():
    def square(x):
        return x * x

    prim = rules.primitive(square)

    @prim.rrule
    def square_rrule(x):
        return prim(x), lambda y_bar: (NoTangent(), 2 * x * y_bar)

    @prim.frule
    def square_frule(tangents, x):
        return prim(x), 2 * x * tangents[1]

    assert rrule(prim, 3.0)[1](1.0) == (NoTangent(), 6.0)
    assert rrule(square, 3.0)[1](1.0) == (NoTangent(), 6.0)  # same key
    assert frule((NoTangent(), 1.0), square, 3.0) == (9.0, 6.0)

    # `rrule.register(prim)` is the same as `@prim.rrule`
    rrule.register(prim, tagged_rrule("via register"))
    assert rrule(square, 3.0)[0] == "via register"


def test_unknown_function_has_no_rule():
    f = make_function()
    assert rrule(f, 1.0) is None
    assert frule((NoTangent(), 1.0), f, 1.0) is None
    assert not rules.has_rrule(f, 1.0) and not rules.has_frule(f, 1.0)


def test_register_rejects_non_types_and_non_callables():
    f = make_function()
    with pytest.raises(rules.RuleDefinitionError, match="not a type"):
        rrule.register(f, types=(3,))
    with pytest.raises(rules.RuleDefinitionError, match="callable"):
        rrule.register(f, "not a rule")


def test_frule_with_the_wrong_number_of_tangents_raises():
    f = make_function("needs_two_tangents")
    frule.register(f, lambda tangents, x: (x, tangents[1]))
    with pytest.raises(rules.RuleDefinitionError, match="wrong number of tangents") as err:
        frule((1.0,), f, 2.0)
    assert "needs_two_tangents" in str(err.value)


# ------------------------------------------------------------------------------------------
# Type restrictions: most specific match, varargs, ambiguity
# ------------------------------------------------------------------------------------------


def test_most_specific_signature_wins():
    f = make_function()
    rrule.register(f, tagged_rrule("object"), types=(object,))
    rrule.register(f, tagged_rrule("array"), types=(jax.Array,))
    assert rrule(f, jnp.ones(2))[0] == "array"
    assert rrule(f, 1.0)[0] == "object"
    assert rrule(f, 1.0, 2.0) is None  # arity is part of the signature
    # an unrestricted rule is the least specific of all
    rrule.register(f, tagged_rrule("any"))
    assert rrule(f, jnp.ones(2))[0] == "array"
    assert rrule(f, 1.0, 2.0)[0] == "any"


def test_union_types_in_a_signature():
    f = make_function()
    rrule.register(f, tagged_rrule("number"), types=((int, float),))
    rrule.register(f, tagged_rrule("int"), types=(int,))
    assert rrule(f, 2)[0] == "int"
    assert rrule(f, 2.5)[0] == "number"
    assert rrule(f, "s") is None


def test_varargs_signature_with_ellipsis():
    f = make_function()
    rrule.register(f, tagged_rrule("array, ..."), types=(jax.Array, ...))
    assert rrule(f, jnp.ones(2))[0] == "array, ..."
    assert rrule(f, jnp.ones(2), 1, "s", None)[0] == "array, ..."
    assert rrule(f, 1.0, jnp.ones(2)) is None
    assert rrule(f) is None
    # a fixed signature is more specific than a varargs one
    rrule.register(f, tagged_rrule("array, int"), types=(jax.Array, int))
    assert rrule(f, jnp.ones(2), 3)[0] == "array, int"
    assert rrule(f, jnp.ones(2), 3.0)[0] == "array, ..."
    # the varargs pullback still has one entry per argument
    _, back = rrule(f, jnp.ones(2), 1, "s")
    assert back(1.0) == (NoTangent(),) * 4


def test_ambiguous_signatures_raise_naming_both():
    f = make_function("two_ways")
    rrule.register(f, tagged_rrule("left"), types=(jax.Array, object))
    rrule.register(f, tagged_rrule("right"), types=(object, jax.Array))
    assert rrule(f, jnp.ones(2), 1.0)[0] == "left"
    assert rrule(f, 1.0, jnp.ones(2))[0] == "right"
    with pytest.raises(rules.AmbiguousRuleError) as err:
        rrule(f, jnp.ones(2), jnp.ones(2))
    assert isinstance(err.value, rules.RuleError)
    message = str(err.value)
    assert "two_ways" in message
    array = jax.Array.__name__  # "jaxlib._jax.Array" in this JAX version
    assert f"({array}, object)" in message and f"(object, {array})" in message
    with pytest.raises(rules.AmbiguousRuleError):
        rules.has_rrule(f, jnp.ones(2), jnp.ones(2))
    # registering the intersection resolves it
    rrule.register(f, tagged_rrule("both"), types=(jax.Array, jax.Array))
    assert rrule(f, jnp.ones(2), jnp.ones(2))[0] == "both"


def test_has_rrule_and_has_frule_do_not_call_the_rule():
    f = make_function()
    calls = []

    def counting_rrule(x):
        calls.append("rrule")
        return x, lambda y_bar: (NoTangent(), y_bar)

    def counting_frule(tangents, x):
        calls.append("frule")
        return x, tangents[1]

    rrule.register(f, counting_rrule, types=(float,))
    frule.register(f, counting_frule, types=(float,))
    assert rules.has_rrule(f, 1.0) and rules.has_frule(f, 1.0)
    assert not rules.has_rrule(f, "s") and not rules.has_frule(f, "s")
    assert calls == []
    rrule(f, 1.0)
    frule((NoTangent(), 1.0), f, 1.0)
    assert calls == ["rrule", "frule"]


def test_opt_out_removes_the_rule_for_those_types_only():
    f = make_function()
    rrule.register(f, tagged_rrule("generic"))
    frule.register(f, lambda tangents, x: (x, tangents[1]))
    rules.opt_out(f, types=(int,))
    assert not rules.has_rrule(f, 3) and not rules.has_frule(f, 3)
    assert rrule(f, 3) is None and frule((NoTangent(), 1.0), f, 3) is None
    assert rules.has_rrule(f, 3.0) and rules.has_frule(f, 3.0)
    assert rrule(f, 3.0)[0] == "generic"


def test_opted_out_primitive_is_differentiated_by_jax():
    prim = rules.primitive(lambda x: x**3)
    prim.rrule(lambda x: (prim(x), lambda y_bar: (NoTangent(), 7 * 3 * x**2 * y_bar)))
    assert float(jax.grad(prim)(2.0)) == pytest.approx(84.0)
    rules.opt_out(prim, types=(object,))
    assert float(jax.grad(prim)(2.0)) == pytest.approx(12.0)


# ------------------------------------------------------------------------------------------
# Rules returning None
# ------------------------------------------------------------------------------------------


def test_registered_rrule_returning_none_is_a_rule_error():
    f = make_function("forgetful")
    rrule.register(f, lambda x: None)
    with pytest.raises(rules.RuleDefinitionError) as err:
        rrule(f, 1.0)
    assert isinstance(err.value, rules.RuleError)
    message = str(err.value)
    assert "forgetful" in message and "returned None" in message
    assert "return (y, pullback)" in message and "opt_out" in message


def test_registered_frule_returning_none_is_a_rule_error():
    f = make_function("forgetful_forward")
    frule.register(f, lambda tangents, x: None)
    with pytest.raises(rules.RuleDefinitionError) as err:
        frule((NoTangent(), 1.0), f, 1.0)
    message = str(err.value)
    assert "forgetful_forward" in message and "returned None" in message and "opt_out" in message


def test_rrule_returning_a_non_pair_is_a_rule_error():
    f = make_function("single")
    rrule.register(f, lambda x: x)
    with pytest.raises(rules.RuleDefinitionError, match="must return \\(y, pullback\\)"):
        rrule(f, 1.0)


# ------------------------------------------------------------------------------------------
# Redefinition and the registry version
# ------------------------------------------------------------------------------------------


def test_redefining_a_rule_takes_effect_on_the_next_call():
    f = make_function()
    before = rules.registry_version()
    rrule.register(f, tagged_rrule("first"))
    assert rrule(f, 1.0)[0] == "first"
    rrule.register(f, tagged_rrule("second"))
    assert rrule(f, 1.0)[0] == "second"
    assert rules.registry_version() == before + 2
    assert len(rrule._rules[f]) == 1  # the same signature is replaced, not added


def test_redefining_a_rule_reaches_an_already_jitted_function():
    @rules.primitive
    def prim(x):
        return x**2

    prim.rrule(lambda x: (prim(x), lambda y_bar: (NoTangent(), 7 * 2 * x * y_bar)))
    g = jax.jit(jax.grad(prim))
    assert float(g(3.0)) == pytest.approx(42.0)
    prim.rrule(lambda x: (prim(x), lambda y_bar: (NoTangent(), 5 * 2 * x * y_bar)))
    assert float(g(3.0)) == pytest.approx(30.0)  # same g, same shapes
    prim.rrule(lambda x: (prim(x), lambda y_bar: (NoTangent(), 2 * x * y_bar)))
    assert float(g(3.0)) == pytest.approx(6.0)


def test_concurrent_registration_from_8_threads():
    f = make_function()
    classes = [type(f"Kind{i}", (), {}) for i in range(8)]
    functions = [make_function(f"g{i}") for i in range(8)]
    barrier = threading.Barrier(8)
    before = rules.registry_version()
    errors = []

    def register(i):
        try:
            barrier.wait()
            rrule.register(f, tagged_rrule(i), types=(classes[i],))
            rrule.register(functions[i], tagged_rrule(i))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert rules.registry_version() == before + 16
    assert len(rrule._rules[f]) == 8
    for i in range(8):
        assert rrule(f, classes[i]())[0] == i
        assert rrule(functions[i], 1.0)[0] == i


# ------------------------------------------------------------------------------------------
# Keyword arguments
# ------------------------------------------------------------------------------------------


def test_keyword_arguments_are_passed_to_the_rule_and_not_differentiated():
    def scale(x, *, factor=1.0, mode="mul"):
        return x * factor

    seen = {}

    @rrule.register(scale)
    def scale_rrule(x, *, factor=1.0, mode="mul"):
        seen["rrule"] = (factor, mode)
        return scale(x, factor=factor), lambda y_bar: (NoTangent(), y_bar * factor)

    @frule.register(scale)
    def scale_frule(tangents, x, *, factor=1.0, mode="mul"):
        seen["frule"] = (factor, mode)
        return scale(x, factor=factor), tangents[1] * factor

    y, back = rrule(scale, 2.0, factor=3.0, mode="fast")
    assert y == 6.0 and back(1.0) == (NoTangent(), 3.0)  # no entry for the keywords
    assert frule((NoTangent(), 1.0), scale, 2.0, factor=4.0, mode="slow") == (8.0, 4.0)
    assert seen == {"rrule": (3.0, "fast"), "frule": (4.0, "slow")}


def test_keyword_array_arguments_of_a_primitive_are_not_differentiated(maybe_jit):
    @rules.primitive
    def scale(x, *, factor):
        return x * factor

    scale.rrule(lambda x, *, factor: (scale(x, factor=factor), lambda y_bar: (NoTangent(), 7 * y_bar * factor)))
    g = maybe_jit(jax.grad(lambda x, s: scale(x, factor=s)))(2.0, 3.0)
    assert float(g) == pytest.approx(21.0)
    # differentiating the keyword array would give a zero derivative: an error instead
    with pytest.raises(rules.RuleDefinitionError, match="an array given by keyword is being differentiated"):
        maybe_jit(jax.grad(lambda x, s: scale(x, factor=s), argnums=(0, 1)))(2.0, 3.0)


# ------------------------------------------------------------------------------------------
# rrule_via_ad / frule_via_ad
# ------------------------------------------------------------------------------------------


def test_rrule_via_ad_uses_the_registered_rule():
    f = make_function()
    rrule.register(f, lambda x: (x**2, lambda y_bar: (NoTangent(), 7 * 2 * x * y_bar)))
    y, back = rules.rrule_via_ad(f, 3.0)
    assert y == 9.0 and back(1.0) == (NoTangent(), 42.0)


def test_rrule_via_ad_without_a_rule_uses_jax_in_chainrules_conventions():
    def power_sum(x, n, label):
        return jnp.sum(x**n)

    x = jnp.array([1.0, 2.0, 3.0])
    y, back = rules.rrule_via_ad(power_sum, x, 3, "label")
    assert float(y) == 36.0
    cts = back(2.0)
    assert len(cts) == 4
    assert cts[0] is NoTangent() and cts[2] is NoTangent() and cts[3] is NoTangent()
    np.testing.assert_allclose(cts[1], 2.0 * 3 * x**2)
    assert back(rules.ZeroTangent())[1].shape == (3,)


def test_rrule_via_ad_pytree_argument_and_keyword():
    def weighted(p, x, *, bias):
        return jnp.sum(p["w"] * x) + bias

    p, x = {"w": jnp.array([1.0, 2.0])}, jnp.array([3.0, 4.0])
    y, back = rules.rrule_via_ad(weighted, p, x, bias=10.0)
    assert float(y) == 21.0
    f_bar, p_bar, x_bar = back(1.0)
    np.testing.assert_allclose(p_bar["w"], x)
    np.testing.assert_allclose(x_bar, p["w"])


def test_rrule_via_ad_complex_convention():
    def square(z):
        return z**2

    z, seed = 1.0 + 2.0j, 0.5 - 1.5j
    _, back = rules.rrule_via_ad(square, z)
    ours = complex(back(seed)[1])
    jax_ct = complex(jax.vjp(square, z)[1](np.conj(seed))[0])
    assert ours == pytest.approx(np.conj(jax_ct))
    assert ours == pytest.approx(seed * np.conj(2 * z))
    # for a real loss: dl/dRe z + i dl/dIm z, the conjugate of jax.grad
    _, back_abs2 = rules.rrule_via_ad(lambda z: jnp.abs(z) ** 2, z)
    assert complex(back_abs2(1.0)[1]) == pytest.approx(2 * z)
    assert complex(jax.grad(lambda z: jnp.abs(z) ** 2)(z)) == pytest.approx(np.conj(2 * z))


def test_frule_via_ad_with_and_without_a_rule():
    def cube(x, n):
        return x**3 * n

    y, y_dot = rules.frule_via_ad((NoTangent(), 1.0, NoTangent()), cube, 2.0, 2)
    assert float(y) == 16.0 and float(y_dot) == 24.0
    y, y_dot = rules.frule_via_ad((NoTangent(), rules.ZeroTangent(), NoTangent()), cube, 2.0, 2)
    assert float(y_dot) == 0.0

    frule.register(cube, lambda tangents, x, n: (cube(x, n), 7 * 3 * x**2 * n * tangents[1]))
    assert rules.frule_via_ad((NoTangent(), 1.0, NoTangent()), cube, 2.0, 2) == (16.0, 168.0)


def test_frule_via_ad_complex_tangent_matches_jvp():
    z, z_dot = jnp.array([1.0 + 2.0j, -1.0 + 0.5j]), jnp.array([0.5 - 1.0j, 2.0 + 0.0j])
    _, ours = rules.frule_via_ad((NoTangent(), z_dot), lambda z: z**2, z)
    np.testing.assert_allclose(ours, jax.jvp(lambda z: z**2, (z,), (z_dot,))[1])
    np.testing.assert_allclose(ours, 2 * z * z_dot)


# ------------------------------------------------------------------------------------------
# Examples
# ------------------------------------------------------------------------------------------


def test_register_examples_validates_and_attaches():
    from rules._registry import examples_of

    f = make_function("with_examples")
    rules.register_examples(f, [(1.0,), (2.0, 3)])
    assert examples_of(f) == [(1.0,), (2.0, 3)]
    with pytest.raises(rules.RuleDefinitionError) as err:
        rules.register_examples(f, [(1.0,), 2.0])
    assert "with_examples" in str(err.value) and "tuples" in str(err.value)
    assert examples_of(f) == [(1.0,), (2.0, 3)]  # nothing from the rejected batch

    prim = rules.primitive(examples=[(jnp.ones(2),)])(lambda x: x)
    assert len(prim.examples) == 1 and prim.examples[0][0].shape == (2,)


# ------------------------------------------------------------------------------------------
# Redefinition reaches functions JAX already compiled, in every order
# ------------------------------------------------------------------------------------------


def test_adding_a_first_rule_reaches_an_already_jitted_function():
    sq = rules.primitive(lambda x: x * x)
    g = jax.jit(jax.grad(sq))
    assert float(g(3.0)) == 6.0  # no rule yet: JAX differentiates the function
    sq.rrule(lambda x: (sq(x), lambda b: (rules.NoTangent(), 7 * 2 * x * b)))
    assert float(g(3.0)) == 42.0


def test_switching_back_and_forth_between_rules_reaches_a_jitted_function():
    sq = rules.primitive(lambda x: x * x)
    rule_a = lambda x: (sq(x), lambda b: (rules.NoTangent(), 2 * 2 * x * b))  # noqa: E731
    rule_b = lambda x: (sq(x), lambda b: (rules.NoTangent(), 3 * 2 * x * b))  # noqa: E731
    g = jax.jit(jax.grad(sq))
    for rule, factor in [(rule_a, 2), (rule_b, 3), (rule_a, 2), (rule_b, 3)]:
        sq.rrule(rule)
        assert float(g(3.0)) == factor * 6.0
