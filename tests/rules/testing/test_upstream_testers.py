"""ChainRulesTestUtils.jl's tester tests, ported: upstream test/testers.jl and test/rule_config.jl.

Each test's docstring names the upstream testset it carries over (the facts, in our API:
`with_tangent(x, x_dot)` for `x ⊢ ẋ`, keyword arguments for `fkwargs`, `rrule_f=`/`frule_f=`
for a rule-like function under test). Every rule is defined on a fresh primitive inside its
test, so registrations never leak between tests. Arrays are small and the lowered
primitive's jit/vmap checks run only where the upstream case is about the rule itself
passing, to keep the module fast.

Upstream cases without a JAX meaning, not ported:

- testers.jl "check rules are inferrable" (check inferred; not inferred in frule, rrule,
  pullback, thunk; non-inferrable primal with an inferrable pullback), "@maybe_inferred"
  and "inference of thunked cotangents": Julia's type inference. A traced JAX function has
  one static output type per input type; what remains of the fact (a tangent of the
  primal's dtype) is the testers' dtype check, tested in test_testers.py.
- testers.jl "frule with mutation" (`finplace!`): JAX arrays are immutable, so a rule cannot
  mutate its arguments, tangents or keyword arguments.
- testers.jl "check passing of testset_name kwarg": Julia testset names; pytest names the
  tests, and `RuleReport.function` names the rule checked.
- testers.jl "tuple input: first" builds its zero tangents with `falses(n)` (Bool zeros): a
  Bool is not a tangent in JAX (float0); the port uses `ZeroTangent()`.
- rule_config.jl "custom_config" (`MySpecialConfig`, `RuleConfig{>:Trait}`): rules here do
  not dispatch on the capabilities of the AD system calling them; there is one rule table.
  The `config` argument of the other rule_config.jl cases is dropped likewise: `rrule_f` is
  called as `rrule_f(f, *args)`, `frule_f` as `frule_f(tangents, f, *args)`.
- rule_config.jl "TestConfig direct"/"in a rule" use ChainRulesTestUtils' finite-difference
  `TestConfig` as the AD system; the port uses JAX's AD through `rules.rrule_via_ad` and
  `rules.frule_via_ad`, which is what that config stands for.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
from rules import InplaceableThunk, NoTangent, Tangent, Thunk, ZeroTangent, not_implemented, unthunk
from rules.testing import test_approx, test_frule, test_rrule, test_scalar, with_tangent

RNG = np.random.default_rng(20240611)
LIGHT = dict(check_jit=False, check_vmap=False)  # upstream checks the rule only


def randn(*shape):
    """A float64 array (a Python float for no shape), as Julia's `randn`."""
    value = RNG.standard_normal(shape)
    return float(value) if not shape else jnp.asarray(value)


def prim(name, fn):
    """A fresh primitive called `name`."""

    def primal(*args, **kwargs):
        return fn(*args, **kwargs)

    primal.__name__ = primal.__qualname__ = name
    return rules.primitive(primal)


# ------------------------------------------------------------------------------------------
# testers.jl
# ------------------------------------------------------------------------------------------


def test_scalar_passes_a_correct_rule_and_fails_a_wrong_partial():
    """testers.jl "test_scalar": `@scalar_rule(double(x), 2)` passes, a partial of 3 fails."""
    double = rules.scalar_rule(prim("double", lambda x: 2 * x), lambda x, y: 2.0)
    test_scalar(double, 2.1)
    alt_double = rules.scalar_rule(prim("alt_double", lambda x: 2 * x), lambda x, y: 3.0)
    with pytest.raises(AssertionError):
        test_scalar(alt_double, 2.1)


def _identity():
    ident = prim("identity", lambda x: x)
    ident.frule(lambda tangents, x: (x, tangents[1]))

    @ident.rrule
    def identity_rrule(x):
        def identity_pullback(y_bar):
            return NoTangent(), y_bar

        return x, identity_pullback

    return ident


@pytest.mark.parametrize("x", [randn(), randn(4)], ids=["scalar", "vector"])
def test_identity_frule_and_rrule(x):
    """testers.jl "unary: identity(x)": test_frule and test_rrule on a scalar and a vector."""
    ident = _identity()
    test_frule(ident, x)
    test_rrule(ident, x)


def _inplace_identity(scale, used):
    ident = prim("my_identity", lambda x: x)

    @ident.frule
    def identity_frule(tangents, x):
        x_dot = tangents[1]

        def add(acc):
            used.append("frule")
            return acc + scale * x_dot

        return x, InplaceableThunk(add, Thunk(lambda: x_dot))

    @ident.rrule
    def identity_rrule(x):
        def identity_pullback(y_bar):
            def add(acc):
                used.append("rrule")
                return acc + scale * unthunk(y_bar)

            return NoTangent(), InplaceableThunk(add, Thunk(lambda: unthunk(y_bar)))

        return x, identity_pullback

    return ident


def test_inplaceable_thunks_have_their_add_function_called():
    """testers.jl "Inplace accumulation: identity on Array", correct definitions: both testers
    use (and so test) the `add` function of an `InplaceableThunk`."""
    used: list[str] = []
    ident = _inplace_identity(1.0, used)
    test_frule(ident, randn(4), **LIGHT)
    assert "frule" in used
    test_rrule(ident, randn(4), **LIGHT)
    assert "rrule" in used


def test_a_wrong_inplaceable_add_fails_both_testers():
    """testers.jl "Incorrect in-place definitions": only the `add` part is wrong (200x)."""
    ident = _inplace_identity(200.0, [])
    with pytest.raises(AssertionError, match="InplaceableThunk"):
        test_frule(ident, randn(4), **LIGHT)
    with pytest.raises(AssertionError, match="InplaceableThunk"):
        test_rrule(ident, randn(4), **LIGHT)


def test_an_rrule_that_conjugates_the_derivative_passes_on_complex_input():
    """testers.jl "test derivative conjugated in pullback": `conj(cos(x)) * ȳ`."""
    sinconj = prim("sinconj", jnp.sin)
    sinconj.frule(lambda tangents, x: (jnp.sin(x), jnp.cos(x) * tangents[1]))

    @sinconj.rrule
    def sinconj_rrule(x):
        def sinconj_pullback(y_bar):
            return NoTangent(), jnp.conj(jnp.cos(x)) * unthunk(y_bar)

        return jnp.sin(x), sinconj_pullback

    z = complex(randn(), randn())
    test_rrule(sinconj, z)
    test_scalar(sinconj, z)


def _fst():
    fst = prim("fst", lambda x, y: x)
    fst.frule(lambda tangents, x, y: (x, tangents[1]))

    @fst.rrule
    def fst_rrule(x, y):
        def fst_pullback(y_bar):
            return NoTangent(), y_bar, ZeroTangent()

        return x, fst_pullback

    return fst


@pytest.mark.parametrize("args", [(2.0, 3.0), (randn(4), randn(4))], ids=["scalars", "vectors"])
def test_binary_rule_with_a_zero_cotangent(args):
    """testers.jl "binary: fst(x, y)": the rrule returns `ZeroTangent()` for y."""
    fst = _fst()
    test_frule(fst, *args)
    test_rrule(fst, *args)


def _simo():
    simo = prim("simo", lambda x: (x, 2 * x))

    @simo.rrule
    def simo_rrule(x):
        def simo_pullback(y_bar):
            a, b = unthunk(y_bar)
            return NoTangent(), a + 2 * b

        return simo(x), simo_pullback

    @simo.frule
    def simo_frule(tangents, x):
        y = simo(x)
        return y, Tangent(tuple, tangents[1], 2 * tangents[1])

    return simo


@pytest.mark.parametrize("x", [1.5, randn(4)], ids=["scalar", "vector"])
def test_single_input_tuple_output(x):
    """testers.jl "single input, multiple output": a tuple output, its tangent a `Tangent`."""
    simo = _simo()
    test_frule(simo, x)
    test_rrule(simo, x)


@pytest.mark.parametrize("xs", [(2.0, 3.0), tuple(float(v) for v in RNG.standard_normal(4))], ids=["2", "4"])
def test_tuple_input(xs):
    """testers.jl "tuple input: first": `first` of a tuple; the cotangent is a `Tangent`."""
    first = prim("first", lambda xs: xs[0])
    first.frule(lambda tangents, xs: (xs[0], unthunk(tangents[1])[0]))

    @first.rrule
    def first_rrule(xs):
        def first_pullback(y_bar):
            return NoTangent(), Tangent(tuple, unthunk(y_bar), *[ZeroTangent()] * (len(xs) - 1))

        return xs[0], first_pullback

    test_frule(first, xs)
    test_rrule(first, xs)


def test_tuple_output_with_a_constant_entry():
    """testers.jl "tuple output (backing type of Tangent =/= natural differential)"."""
    tuple_out = prim("tuple_out", lambda x: (x, 1.0))
    tuple_out.frule(lambda tangents, x: ((x, 1.0), Tangent(tuple, tangents[1], ZeroTangent())))
    test_frule(tuple_out, 2.0)


def test_a_string_argument_is_ignored():
    """testers.jl "ignoring arguments": `fsymtest(x, s::Symbol)`; a str here."""
    fsymtest = prim("fsymtest", lambda x, s: x)
    fsymtest.frule(lambda tangents, x, s: (x, tangents[1]))

    @fsymtest.rrule
    def fsymtest_rrule(x, s):
        def fsymtest_pullback(y_bar):
            return NoTangent(), y_bar, NoTangent()

        return x, fsymtest_pullback

    test_frule(fsymtest, 2.5, "x")
    test_rrule(fsymtest, 2.5, "x")


def _raise_unless(err):
    if err:
        raise ValueError("futestkws_err")


def _futestkws():
    def fn(x, err=True):
        _raise_unless(err)
        return x

    futestkws = prim("futestkws", fn)

    @futestkws.frule
    def futestkws_frule(tangents, x, err=True):
        return futestkws(x, err=err), tangents[1]

    @futestkws.rrule
    def futestkws_rrule(x, err=True):
        def futestkws_pullback(y_bar):
            return NoTangent(), y_bar

        return futestkws(x, err=err), futestkws_pullback

    return futestkws


def test_unary_keyword_arguments_reach_the_function_and_its_rules():
    """testers.jl "unary with kwargs: futestkws(x; err)": without `err=False` everything
    raises; with it, test_scalar, test_frule and test_rrule pass."""
    futestkws = _futestkws()
    for call in (lambda: futestkws(randn()), lambda: rules.frule((NoTangent(), 1.0), futestkws, randn()),
                 lambda: rules.rrule(futestkws, randn()), lambda: futestkws(randn(4))):
        with pytest.raises(ValueError, match="futestkws_err"):
            call()
    with pytest.raises(ValueError, match="futestkws_err"):
        test_scalar(futestkws, randn())
    test_scalar(futestkws, 2.5, err=False)
    test_frule(futestkws, 2.5, err=False)
    test_rrule(futestkws, 2.5, err=False)


@pytest.mark.parametrize("args", [(2.5, 3.0), (randn(4), randn(4))], ids=["scalars", "vectors"])
def test_binary_keyword_arguments_reach_the_function_and_its_rules(args):
    """testers.jl "binary with kwargs: fbtestkws(x, y; err)"."""

    def fn(x, y, err=True):
        _raise_unless(err)
        return x

    fbtestkws = prim("fbtestkws", fn)

    @fbtestkws.frule
    def fbtestkws_frule(tangents, x, y, err=True):
        return fbtestkws(x, y, err=err), tangents[1]

    @fbtestkws.rrule
    def fbtestkws_rrule(x, y, err=True):
        def fbtestkws_pullback(y_bar):
            return NoTangent(), y_bar, ZeroTangent()

        return fbtestkws(x, y, err=err), fbtestkws_pullback

    with pytest.raises(ValueError, match="futestkws_err"):
        rules.rrule(fbtestkws, *args)
    test_frule(fbtestkws, *args, err=False)
    test_rrule(fbtestkws, *args, err=False)


def test_a_primal_only_approximately_equal_passes_with_atol():
    """testers.jl "primal can be only approximately equal": `x + sqrt(eps(x))`, atol=1e-6."""
    off = float(np.sqrt(np.spacing(2.5)))
    approx = prim("primalapprox", lambda x: x)
    approx.frule(lambda tangents, x: (x + off, tangents[1]))

    @approx.rrule
    def approx_rrule(x):
        return x + off, lambda y_bar: (NoTangent(), y_bar)

    test_frule(approx, 2.5, atol=1e-6, **LIGHT)
    test_rrule(approx, 2.5, atol=1e-6, **LIGHT)


@jax.tree_util.register_pytree_node_class
class Iterator:
    """ChainRulesTestUtils' `TestIterator` as a pytree: data, and static iterator traits."""

    def __init__(self, data, size_known=False, eltype_known=False):
        self.data, self.size_known, self.eltype_known = data, size_known, eltype_known

    def tree_flatten(self):
        return (self.data,), (self.size_known, self.eltype_known)

    @classmethod
    def tree_unflatten(cls, traits, children):
        return cls(children[0], *traits)


def test_a_custom_container_input_with_a_natural_cotangent():
    """testers.jl "TestIterator input": `iterfun` sums the squares of a container's entries;
    the rrule's cotangent is a container of the same type (a natural tangent)."""
    iterfun = prim("iterfun", lambda it: jnp.sum(it.data**2))
    iterfun.frule(lambda tangents, it: (iterfun(it), jnp.sum(2 * it.data * unthunk(tangents[1]).data)))

    @iterfun.rrule
    def iterfun_rrule(it):
        def iterfun_pullback(s_bar):
            return NoTangent(), Iterator(2 * unthunk(s_bar) * jnp.conj(it.data), it.size_known, it.eltype_known)

        return iterfun(it), iterfun_pullback

    x = Iterator(randn(2, 3))
    test_frule(iterfun, x)
    test_rrule(iterfun, x)


class TestUnhappyPath:
    """testers.jl "unhappy path"."""

    def test_a_wrong_primal_fails(self):
        """"primal wrong": the rules return 2.5x for the identity."""
        f = prim("my_identity1", lambda x: x)
        f.frule(lambda tangents, x: (2.5 * x, tangents[1]))
        f.rrule(lambda x: (2.5 * x, lambda y_bar: (NoTangent(), y_bar)))
        with pytest.raises(AssertionError, match="primal"):
            test_frule(f, 2.2, **LIGHT)
        with pytest.raises(AssertionError, match="primal"):
            test_rrule(f, 2.2, **LIGHT)

    def test_a_wrong_derivative_fails(self):
        """"derivative wrong": 2.7 in the frule, 31.8 in the rrule."""
        f = prim("my_identity2", lambda x: x)
        f.frule(lambda tangents, x: (x, 2.7 * tangents[1]))
        f.rrule(lambda x: (x, lambda y_bar: (NoTangent(), 31.8 * y_bar)))
        with pytest.raises(AssertionError, match="finite differences"):
            test_frule(f, 2.2, **LIGHT)
        with pytest.raises(AssertionError, match="finite differences"):
            test_rrule(f, 2.2, **LIGHT)

    def test_the_wrong_number_of_outputs_fails(self):
        """"wrong number of outputs #167": an extra tangent from the frule, a missing
        cotangent from the pullback."""
        foo = prim("foo", lambda x, y: x + 2 * y)
        foo.frule(lambda tangents, x, y: (foo(x, y), tangents[1] + 2 * tangents[2], NoTangent()))
        foo.rrule(lambda x, y: (foo(x, y), lambda dz: (NoTangent(), dz)))
        with pytest.raises(AssertionError, match=r"\(y, y_dot\)"):
            test_frule(foo, 2.1, 2.1, **LIGHT)
        with pytest.raises(AssertionError, match="wrong number of cotangents"):
            test_rrule(foo, 21.0, 32.0, **LIGHT)

    def test_a_pullback_not_returning_a_tuple_fails(self):
        """"rrule not returning a tuple"."""
        bar = prim("bar", lambda x, y: x + 3 * y)
        bar.rrule(lambda x, y: (bar(x, y), lambda dy: dy))
        with pytest.raises(AssertionError, match="must return a tuple"):
            test_rrule(bar, 21.0, 32.0, **LIGHT)


class Foo(NamedTuple):
    """ChainRulesTestUtils' `Foo`: a callable struct with a differentiable field."""

    a: float

    def __call__(self, x):
        return self.a + x


def _foo_rules(foo):
    """The functor's rules, registered on the instance (rules are keyed by the callable)."""

    def foo_frule(tangents, x):
        f_dot, x_dot = tangents
        return foo(x), unthunk(f_dot).a + x_dot

    def foo_rrule(x):
        def foo_pullback(y_bar):
            return Tangent(Foo, a=unthunk(y_bar)), y_bar

        return foo(x), foo_pullback

    rules.frule.register(foo, foo_frule, plain=True)
    rules.rrule.register(foo, foo_rrule, plain=True)
    return foo


def test_a_struct_constructor_has_rules():
    """testers.jl "structs", "constructor": `Foo(a)` with an rrule and an frule whose
    tangents are natural (a `Foo`)."""
    foo_type = rules.primitive(Foo)

    @foo_type.rrule
    def foo_constructor_rrule(a):
        return Foo(a), lambda foo_bar: (NoTangent(), unthunk(foo_bar).a)

    foo_type.frule(lambda tangents, a: (Foo(a), Foo(tangents[1])))
    test_frule(foo_type, randn(), **LIGHT)
    test_rrule(foo_type, randn(), **LIGHT)


def test_a_callable_struct_with_a_differentiable_field():
    """testers.jl "structs", "functor": the struct is perturbed too (its tangent random, a
    `Foo`, or a `Tangent`) and `f_bar` is checked against finite differences."""
    foo = _foo_rules(Foo(float(RNG.uniform())))
    test_frule(foo, randn())
    test_rrule(foo, randn())
    test_scalar(foo, randn())
    test_frule(with_tangent(foo, Foo(randn())), randn())
    test_frule(with_tangent(foo, Tangent(Foo, a=randn())), randn())
    test_rrule(with_tangent(foo, Foo(randn())), randn())
    test_rrule(with_tangent(foo, Tangent(Foo, a=randn())), randn())


def test_a_wrong_f_bar_of_a_callable_struct_fails():
    """testers.jl "structs": the converse, a functor whose `f_bar` is off by a factor."""
    foo = Foo(0.25)
    rules.rrule.register(foo, lambda x: (foo(x), lambda y_bar: (Tangent(Foo, a=2 * unthunk(y_bar)), y_bar)),
                         plain=True)
    with pytest.raises(AssertionError, match="f_bar"):
        test_rrule(foo, randn())


def test_tuple_primals_unlike_their_tangents_backing():
    """testers.jl "Tuple primal that is not equal to differential backing": an output (1, 2x)
    whose tangent is (ZeroTangent(), 2 x_dot), and an input (3, 3.0) whose tangent is
    `Tangent(tuple, ZeroTangent(), 1.0)`. (Upstream writes the frule with `@scalar_rule`:
    see `test_scalar_rule_partials_that_are_zero_or_not_implemented`.)"""
    forwards_trouble = prim("forwards_trouble", lambda x: (1, 2.0 * x))
    forwards_trouble.frule(lambda tangents, x: ((1, 2.0 * x), (ZeroTangent(), 2.0 * tangents[1])))
    test_frule(forwards_trouble, 2.5)

    rev_trouble = prim("rev_trouble", lambda xy: xy[1])

    @rev_trouble.rrule
    def rev_trouble_rrule(xy):
        return xy[1], lambda y_bar: (NoTangent(), Tangent(tuple, ZeroTangent(), y_bar))

    test_rrule(rev_trouble, with_tangent((3, 3.0), Tangent(tuple, ZeroTangent(), 1.0)))


def test_scalar_rule_partials_that_are_zero_or_not_implemented():
    """testers.jl "Tuple primal that is not equal to differential backing" and "NotImplemented"
    as upstream writes them: `@scalar_rule` with a `ZeroTangent()` and a `@not_implemented`
    partial."""
    forwards_trouble = rules.scalar_rule(prim("forwards_trouble", lambda x: (1, 2.0 * x)),
                                         lambda v, y: ((ZeroTangent(),), (2.0,)))
    test_frule(forwards_trouble, 2.5)
    f = rules.scalar_rule(prim("f_notimplemented", lambda x, y: (x + y, x - y)),
                          lambda x, y, out: ((not_implemented(""), 1.0), (1.0, -1.0)))
    test_frule(f, randn(), randn(), **LIGHT)
    test_rrule(f, randn(), randn(), **LIGHT)


class TestThunkedOutputTangent:
    """testers.jl "check_thunked_output_tangent"."""

    def test_a_pullback_without_a_method_for_thunks(self):
        """"no method for thunk": passes with the check off, errors with it on."""
        f = prim("does_not_accept_thunk_id", lambda x: x)

        def pullback(y_bar):
            if isinstance(y_bar, rules.AbstractThunk):
                raise TypeError("no method for a Thunk")
            return NoTangent(), y_bar

        f.rrule(lambda x: (x, pullback))
        x = jnp.array([1.0, 2.0])
        test_rrule(f, x, check_thunked_output_tangent=False, **LIGHT)
        with pytest.raises((TypeError, AssertionError), match="Thunk"):
            test_rrule(f, x, **LIGHT)

    def test_a_pullback_wrong_on_thunks(self):
        """"Thunk wrong": twice the cotangent for a thunked seed."""
        f = prim("bad_thunk_id", lambda x: x)

        def pullback(y_bar):
            return NoTangent(), (2 * unthunk(y_bar) if isinstance(y_bar, rules.AbstractThunk) else y_bar)

        f.rrule(lambda x: (x, pullback))
        x = jnp.array([1.0, 2.0])
        test_rrule(f, x, check_thunked_output_tangent=False, **LIGHT)
        with pytest.raises(AssertionError, match="thunked seed"):
            test_rrule(f, x, **LIGHT)


def test_zero_tangent_for_an_integer_argument_says_to_use_no_tangent():
    """testers.jl "error message about incorrectly using ZeroTangent()"."""
    foo = prim("foo", lambda a, i: a[i])

    @foo.rrule
    def foo_rrule(a, i):
        def foo_pullback(y_bar):
            return NoTangent(), jnp.zeros_like(a).at[i].set(unthunk(y_bar)), ZeroTangent()

        return foo(a, i), foo_pullback

    with pytest.raises(AssertionError, match=r"NoTangent\(\)"):
        test_rrule(foo, jnp.array([1.0, 2.0, 3.0]), 1, **LIGHT)


def test_not_implemented_tangents_are_not_checked():
    """testers.jl "NotImplemented": `f(x, y) = (x + y, x - y)` whose partial d(x + y)/dx is
    `@not_implemented` (so is a tangent of the tuple output, and the cotangent of x), and a
    pullback returning `@not_implemented` for a function argument. (Upstream writes the first
    with `@scalar_rule`: see `test_scalar_rule_partials_that_are_zero_or_not_implemented`.)"""
    f = prim("f_notimplemented", lambda x, y: (x + y, x - y))

    @f.frule
    def f_frule(tangents, x, y):
        _, x_dot, y_dot = tangents
        return f(x, y), Tangent(tuple, not_implemented("") * x_dot + y_dot, x_dot - y_dot)

    @f.rrule
    def f_rrule(x, y):
        def f_pullback(y_bar):
            a, b = unthunk(y_bar)
            return NoTangent(), not_implemented("") * a + b, a - b

        return f(x, y), f_pullback

    for report in (test_frule(f, randn(), randn()), test_rrule(f, randn(), randn())):
        assert any(c.startswith("not implemented") for c in report.checks)

    g = prim("f_notimplemented2", lambda fn, x: 2 * fn(x))

    @g.rrule
    def g_rrule(fn, x):
        def g_pullback(y_bar):
            return NoTangent(), not_implemented("TODO: implement this!"), 2 * unthunk(y_bar)

        return g(fn, x), g_pullback

    test_rrule(g, _identity(), randn())


def test_a_wrong_cotangent_next_to_a_not_implemented_one_fails():
    """The converse of "NotImplemented": the implemented part is still checked."""
    f = prim("f_notimplemented", lambda x, y: (x + y, x - y))
    f.frule(lambda t, x, y: (f(x, y), Tangent(tuple, not_implemented(""), 2.0 * (t[1] - t[2]))))
    f.rrule(lambda x, y: (f(x, y), lambda y_bar: (NoTangent(), not_implemented(""), 3.0 * unthunk(y_bar)[0])))
    with pytest.raises(AssertionError, match="finite differences"):
        test_frule(f, randn(), randn(), **LIGHT)
    with pytest.raises(AssertionError, match="finite differences"):
        test_rrule(f, randn(), randn(), **LIGHT)


def test_vectors_of_tuples():
    """testers.jl "vectors of tuples" (ChainRulesTestUtils.jl PR 224): a list of pairs in,
    a (list, float) pair out."""

    def fn(x):
        return [a for a, _ in x], sum(b for _, b in x)

    f = prim("f_vec_of_tuples", fn)

    @f.frule
    def f_frule(tangents, x):
        dx = unthunk(tangents[1])
        firsts, total = fn([tuple(unthunk(t)) for t in dx])
        return fn(x), Tangent(tuple, firsts, total)

    @f.rrule
    def f_rrule(x):
        def f_pullback(y_bar):
            firsts_bar, last_bar = unthunk(y_bar)
            return NoTangent(), [Tangent(tuple, z, last_bar) for z in firsts_bar]

        return fn(x), f_pullback

    x_tuples = [(1.0, 2.0), (3.0, 4.0), (5.0, 6.0)]
    test_frule(f, x_tuples)
    test_rrule(f, x_tuples)


# ------------------------------------------------------------------------------------------
# Must-fail counterparts that upstream's dispatch gives for free
# ------------------------------------------------------------------------------------------


def test_f_bar_must_be_no_tangent_for_a_plain_function():
    """testers.jl `_test_cotangent(::NoTangent, ::ZeroTangent, ::NoTangent)`: a function
    without fields gets `NoTangent()`, not `ZeroTangent()` (rule_config.jl "custom rrule_f",
    `wrong1`, is the same fact)."""
    f = prim("only2x", lambda x, y: 2 * x)
    f.rrule(lambda x, y: (f(x, y), lambda d: (ZeroTangent(), 2 * d, ZeroTangent())))
    with pytest.raises(AssertionError, match=r"NoTangent\(\)"):
        test_rrule(f, 2.0, 3.0, **LIGHT)


@pytest.mark.parametrize("ct", [ZeroTangent(), 1.0], ids=["ZeroTangent", "a-float"])
def test_an_argument_marked_no_tangent_must_get_no_tangent(ct):
    """testers.jl `_test_cotangent(::NoTangent, ...)`: an argument marked `x ⊢ NoTangent()`
    must get `NoTangent()` from the pullback (a `ZeroTangent()`, or any cotangent, fails)."""
    f = prim("mul", lambda a, b: a * b)
    f.rrule(lambda a, b: (a * b, lambda d: (NoTangent(), d * b, ct * d)))
    with pytest.raises(AssertionError, match=r"NoTangent\(\)"):
        test_rrule(f, 2.0, with_tangent(3.0, NoTangent()), **LIGHT)
    g = prim("mul", lambda a, b: a * b)
    g.rrule(lambda a, b: (a * b, lambda d: (NoTangent(), d * b, NoTangent())))
    test_rrule(g, 2.0, with_tangent(3.0, NoTangent()), **LIGHT)


def test_a_constant_or_integer_output():
    """FiniteDifferences' "Integer output" through the testers: `x -> 5` and an integer."""
    five = prim("five", lambda x: 5)
    five.frule(lambda tangents, x: (5, NoTangent()))
    five.rrule(lambda x: (5, lambda y_bar: (NoTangent(), ZeroTangent())))
    test_frule(five, 0.5, **LIGHT)
    test_rrule(five, 0.5, **LIGHT)
    const = prim("const", lambda x: jnp.ones(2) * 5.0)
    const.frule(lambda tangents, x: (jnp.ones(2) * 5.0, ZeroTangent()))
    const.rrule(lambda x: (jnp.ones(2) * 5.0, lambda y_bar: (NoTangent(), ZeroTangent())))
    test_frule(const, randn(3))
    test_rrule(const, randn(3))


# ------------------------------------------------------------------------------------------
# rule_config.jl
# ------------------------------------------------------------------------------------------


def test_a_custom_rrule_f_is_tested():
    """rule_config.jl "custom rrule_f": `rrule_f=custom` passes; `wrong1` (ZeroTangent as
    f_bar), `wrong2` (2.1) and `wrong3` (a missing cotangent) fail."""

    def only2x(x, y):
        return 2 * x

    def custom(f, x, y):
        return f(x, y), lambda d: (NoTangent(), 2 * d, ZeroTangent())

    def wrong1(f, x, y):
        return f(x, y), lambda d: (ZeroTangent(), 2 * d, ZeroTangent())

    def wrong2(f, x, y):
        return f(x, y), lambda d: (NoTangent(), 2.1 * d, ZeroTangent())

    def wrong3(f, x, y):
        return f(x, y), lambda d: (NoTangent(), 2 * d)

    test_rrule(only2x, 2.0, 3.0, rrule_f=custom)
    for wrong in (wrong1, wrong2, wrong3):
        with pytest.raises(AssertionError):
            test_rrule(only2x, 2.0, 3.0, rrule_f=wrong, **LIGHT)


def test_a_custom_frule_f_is_tested():
    """rule_config.jl "custom frule_f": `mytuple(x, y) = (2x, 1.0)`; a tangent 2.1x, or a
    nonzero tangent of the constant entry, fails."""

    def mytuple(x, y):
        return 2 * x, 1.0

    def custom(tangents, f, x, y):
        return f(x, y), Tangent(tuple, 2 * tangents[1], ZeroTangent())

    def wrong1(tangents, f, x, y):
        return f(x, y), Tangent(tuple, 2.1 * tangents[1], ZeroTangent())

    def wrong2(tangents, f, x, y):
        return f(x, y), Tangent(tuple, 2 * tangents[1], 1.0)

    test_frule(mytuple, 2.0, 3.0, frule_f=custom)
    for wrong in (wrong1, wrong2):
        with pytest.raises(AssertionError):
            test_frule(mytuple, 2.0, 3.0, frule_f=wrong, **LIGHT)


def poly(x):
    return x**2 + 3.2 * x


def test_rules_via_jax_ad():
    """rule_config.jl "TestConfig direct": `rrule_via_ad`/`frule_via_ad` of a function
    without rules (JAX's AD here), checked directly and through `rrule_f`/`frule_f`; a
    single-input multiple-output and a multiple-input function with a str argument."""
    x = 2.1
    y, pb = rules.rrule_via_ad(poly, x)
    assert y == poly(x)
    test_approx(pb(1.0), (NoTangent(), 2 * x + 3.2))
    test_rrule(poly, randn(), rrule_f=rules.rrule_via_ad)
    x_dot = randn()
    y, y_dot = rules.frule_via_ad((NoTangent(), x_dot), poly, x)
    assert y == poly(x)
    test_approx(y_dot, (2 * x + 3.2) * x_dot)
    test_frule(poly, x, frule_f=rules.frule_via_ad)

    def simo(x):
        return x, 2 * x, 3 * x

    def miso(x, y, z):
        return x + y

    test_rrule(simo, x, rrule_f=rules.rrule_via_ad, **LIGHT)
    test_rrule(miso, x, 2 * x, "s", rrule_f=rules.rrule_via_ad, **LIGHT)
    test_frule(simo, x, frule_f=rules.frule_via_ad, **LIGHT)
    test_frule(miso, x, x, "s", frule_f=rules.frule_via_ad, **LIGHT)


def test_a_rule_calling_rrule_via_ad_on_its_function_argument():
    """rule_config.jl "TestConfig in a rule": `outer(f, x) = 2 f(x, 3.2)` whose rules call
    `rrule_via_ad`/`frule_via_ad` on `f`."""

    def inner(x, y):
        return x**2 + 2 * y + 3

    outer = prim("outer", lambda f, x: 2 * f(x, 3.2))

    @outer.rrule
    def outer_rrule(f, x):
        fx, pb_f = rules.rrule_via_ad(f, x, 3.2)

        def outer_pullback(y_bar):
            return (NoTangent(), *pb_f(2 * unthunk(y_bar))[:2])

        return 2 * fx, outer_pullback

    @outer.frule
    def outer_frule(tangents, f, x):
        _, f_dot, x_dot = tangents
        y, y_dot = rules.frule_via_ad((f_dot, x_dot, NoTangent()), f, x, 3.2)
        return 2 * y, 2 * y_dot

    test_rrule(outer, inner, randn(), rrule_f=rules.rrule_via_ad, **LIGHT)
    test_frule(outer, inner, randn(), frule_f=rules.frule_via_ad, **LIGHT)


def test_an_incorrect_rule_is_caught_through_rrule_via_ad():
    """rule_config.jl "Catch incorrect rules": `rrule_via_ad` uses the (wrong) rule."""
    myid = prim("myid", lambda x: x)
    myid.rrule(lambda x: (x, lambda d: (NoTangent(), 8 * d)))
    with pytest.raises(AssertionError, match="finite differences"):
        test_rrule(myid, 3.0, rrule_f=rules.rrule_via_ad, **LIGHT)
