"""Tests for rules/testing/_testers.py and _compare.py: the testers are tested.

Two corpora: wrong rules, each of which must fail with a specific message naming what is
wrong and where; and correct rules, each of which must pass with no false alarm. Every case
builds fresh primitives, so registrations never leak between tests.
"""

import dataclasses
import functools
import os
import subprocess
import sys
import textwrap
import types
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

import rules
from rules import InplaceableThunk, NoTangent, Tangent, Thunk, ZeroTangent
from rules.testing import (
    RuleReport,
    WithTangent,
    rand_tangent,
    test_approx,
    test_frule,
    test_rrule,
    test_scalar,
    with_tangent,
)
from rules.testing._testers import _check_partials

FAST = dict(check_jit=False, check_vmap=False)  # for failures found before the lowered checks


# ------------------------------------------------------------------------------------------
# Factories
# ------------------------------------------------------------------------------------------


def fresh_primitive(name, fn):
    """A new primitive called `name` (in messages) computing `fn`."""

    def primal(*args, **kwargs):
        return fn(*args, **kwargs)

    primal.__name__ = primal.__qualname__ = name
    primal.__wrapped__ = fn  # messages name fn's parameters ("argument 1 (x)")
    return rules.primitive(primal)


def with_rrule(name, fn, pullback):
    """A fresh primitive `name` computing `fn`, whose rrule's pullback is `pullback(y_bar, *args)`."""
    f = fresh_primitive(name, fn)

    @f.rrule
    def f_rrule(*args, **kwargs):
        def f_pullback(y_bar):
            return pullback(rules.unthunk(y_bar), *args, **kwargs)  # the seed may be a Thunk

        f_pullback.__name__ = f"{name}_pullback"
        return f(*args, **kwargs), f_pullback

    return f


def add_frule(f, pushforward):
    """Give `f` an frule whose tangent is `pushforward(x_dots, *args)`."""

    @f.frule
    def f_frule(tangents, *args):
        return f(*args), pushforward(tangents[1:], *args)

    return f


def with_frule(name, fn, pushforward):
    return add_frule(fresh_primitive(name, fn), pushforward)


def sin_rule(scale=1.0):
    return with_rrule("mysin", jnp.sin, lambda y_bar, x: (NoTangent(), scale * y_bar * jnp.cos(x)))


def sin_frule(scale=1.0):
    return with_frule("mysin", jnp.sin, lambda dots, x: scale * jnp.cos(x) * dots[0])


def sin_both(frule_scale=1.0, rrule_scale=1.0):
    return add_frule(sin_rule(rrule_scale), lambda dots, x: frule_scale * jnp.cos(x) * dots[0])


X64 = jnp.array([0.3, -1.2, 0.7])
X32 = X64.astype(jnp.float32)
Z = jnp.array([0.3 + 0.4j, -1.0 + 0.2j])
A = jnp.array([[1.0, 2.0], [3.0, 4.5]])
B = jnp.array([[0.5, -1.0], [2.0, 0.25]])
BIG = jnp.asarray(np.random.default_rng(0).standard_normal(10_000))


def _host_total(v):
    return np.full_like(v, np.sum(v))  # sums everything: NOT vectorised over a batch axis


def _total(v):
    """sum(v) broadcast to v's shape, through a host callback wrongly declared vectorised."""
    return jax.pure_callback(_host_total, jax.ShapeDtypeStruct(v.shape, v.dtype), v, vmap_method="expand_dims")


def _host_first_of_batch(v):
    v = np.asarray(v)
    return np.broadcast_to(v[:1], v.shape).copy() if v.ndim > 1 else v


def _first_of_batch(v):
    """v through a host callback wrongly declared vectorised: batched, every element gets
    element 0's value."""
    return jax.pure_callback(_host_first_of_batch, jax.ShapeDtypeStruct(v.shape, v.dtype), v, vmap_method="expand_dims")


def _bad_inplaceable_pullback(y_bar, x):
    value = Thunk(lambda: 2.0 * y_bar)
    return NoTangent(), InplaceableThunk(lambda acc: acc + 3.0 * y_bar, value)  # add_fn adds 3x, val is 2x


def _traced_wrong_pullback(y_bar, x):
    try:
        np.asarray(x)  # concrete: the careful path
        scale = 1.0
    except jax.errors.TracerArrayConversionError:
        scale = 1.001  # traced (what jax.jit sees): a different, wrong, code path
    return NoTangent(), scale * y_bar * jnp.cos(x)


def _thunk_sensitive():
    f = fresh_primitive("mysin", jnp.sin)

    @f.rrule
    def mysin_rrule(x):
        def mysin_pullback(y_bar):
            scale = 2.0 if isinstance(y_bar, Thunk) else 1.0  # wrong for a thunked seed
            return NoTangent(), scale * rules.unthunk(y_bar) * jnp.cos(x)

        return f(x), mysin_pullback

    return f, (X64,), FAST


def _wrong_primal():
    f = fresh_primitive("mysin", jnp.sin)

    @f.rrule
    def mysin_rrule(x):
        return jnp.cos(x), lambda y_bar: (NoTangent(), y_bar * jnp.cos(x))  # cos, not sin

    return f, (X64,), FAST


# ------------------------------------------------------------------------------------------
# Wrong rules: each must fail, with a message that says what and where
# ------------------------------------------------------------------------------------------

# (id, tester, factory -> (f, args, kwargs), substrings the message must contain)
WRONG = [
    (
        "off-by-1.001x-float64",
        test_rrule,
        lambda: (sin_rule(1.001), (X64,), FAST),
        ["test_rrule(mysin)", "cotangent does not match finite differences", "argument: argument 1",
         "relative error 0.000999"],
    ),
    (
        "off-by-1.01x-float32",
        test_rrule,
        lambda: (sin_rule(1.01), (X32,), FAST),
        ["cotangent does not match finite differences", "argument: argument 1", "relative error 0.0099",
         "rtol=0.0001"],
    ),
    (
        "sign-error",
        test_rrule,
        lambda: (sin_rule(-1.0), (X64,), FAST),
        ["cotangent does not match finite differences", "argument: argument 1", "relative error 2;"],
    ),
    (
        "off-by-1.01x-complex64",
        test_rrule,
        lambda: (with_rrule("cexp", jnp.exp, lambda y_bar, z: (NoTangent(), 1.01 * y_bar * jnp.conj(jnp.exp(z)))),
                 (Z.astype(jnp.complex64),), FAST),
        ["cotangent does not match finite differences", "argument: argument 1", "relative error 0.0099"],
    ),
    (
        "missing-conj",
        test_rrule,
        lambda: (with_rrule("csquare", lambda z: z**2, lambda y_bar, z: (NoTangent(), y_bar * 2 * z)), (Z,), FAST),
        ["test_rrule(csquare)", "cotangent does not match finite differences", "argument: argument 1"],
    ),
    (
        "transposed-matrix",
        test_rrule,
        lambda: (
            with_rrule("matmul", lambda a, b: a @ b, lambda y_bar, a, b: (NoTangent(), y_bar @ b, a.T @ y_bar)),
            (A, B),
            FAST,
        ),
        ["test_rrule(matmul)", "cotangent does not match finite differences", "argument: argument 1"],
    ),
    (
        "missing-broadcast-reduction",
        test_rrule,
        lambda: (
            with_rrule("bmul", lambda a, b: a * b, lambda y_bar, a, b: (NoTangent(), y_bar * b, y_bar * a)),
            (jnp.arange(1.0, 7.0).reshape(2, 3), jnp.array([[0.5, 1.5, -2.0]])),
            FAST,
        ),
        ["the rule's tangent does not have its primal's shape and dtype", "argument: argument 2",
         "expected: shape (1, 3), dtype float64", "got:      shape (2, 3)", "ProjectTo"],
    ),
    (
        "wrong-second-argument",
        test_rrule,
        lambda: (
            with_rrule("mul", lambda a, b: a * b, lambda y_bar, a, b: (NoTangent(), y_bar * b, 1.001 * y_bar * a)),
            (X64, X64 + 1.0),
            FAST,
        ),
        ["cotangent does not match finite differences", "argument: argument 2"],
    ),
    (
        "wrong-dict-field-names-the-path",
        test_rrule,
        lambda: (
            with_rrule("affine", lambda p: p["w"] * p["b"],
                       lambda y_bar, p: (NoTangent(), {"w": y_bar * p["b"], "b": 1.001 * y_bar * p["w"]})),
            ({"w": X64, "b": X64 + 2.0},),
            FAST,
        ),
        ["cotangent does not match finite differences", "argument: argument 1 (p) at path ['b']"],
    ),
    (
        "zero-tangent-for-int",
        test_rrule,
        lambda: (
            with_rrule("power", lambda x, n: x**n,
                       lambda y_bar, x, n: (NoTangent(), y_bar * n * x ** (n - 1), ZeroTangent())),
            (X64, 3),
            FAST,
        ),
        ["an argument that cannot be perturbed got ZeroTangent()", "argument: argument 2",
         "expected: NoTangent()", "fix:      return NoTangent()"],
    ),
    (
        "cotangent-for-int",
        test_rrule,
        lambda: (
            with_rrule("power", lambda x, n: x**n, lambda y_bar, x, n: (NoTangent(), y_bar * n * x ** (n - 1), 1.0)),
            (X64, 3),
            FAST,
        ),
        ["an argument that cannot be perturbed got a cotangent", "argument: argument 2", "got:      float"],
    ),
    (
        "f_bar-not-NoTangent",
        test_rrule,
        lambda: (with_rrule("mysin", jnp.sin, lambda y_bar, x: (y_bar, y_bar * jnp.cos(x))), (X64,), FAST),
        ["the cotangent of the function itself must be NoTangent()", "argument: f_bar (entry 0)"],
    ),
    (
        "thunked-seed-differs",
        test_rrule,
        _thunk_sensitive,
        ["a thunked seed gives a different cotangent", "argument: argument 1"],
    ),
    (
        "wrong-arity",
        test_rrule,
        lambda: (with_rrule("mysin", jnp.sin, lambda y_bar, x: (y_bar * jnp.cos(x),)), (X64,), FAST),
        ["the pullback returned the wrong number of cotangents", "expected: 2 (f_bar first", "got:      1"],
    ),
    (
        "list-not-tuple",
        test_rrule,
        lambda: (with_rrule("mysin", jnp.sin, lambda y_bar, x: [NoTangent(), y_bar * jnp.cos(x)]), (X64,), FAST),
        ["the pullback must return a tuple", "expected: a tuple of 2", "got:      list"],
    ),
    (
        "float64-cotangent-for-float32",
        test_rrule,
        lambda: (
            with_rrule("mysin", jnp.sin,
                       lambda y_bar, x: (NoTangent(), (y_bar * jnp.cos(x)).astype(jnp.float64))),
            (X32,),
            FAST,
        ),
        ["shape and dtype", "argument: argument 1", "dtype float32", "got:      shape (3,), dtype float64"],
    ),
    (
        "wrong-primal",
        test_rrule,
        _wrong_primal,
        ["test_rrule(mysin)", "the rrule's primal output differs from f(*args)", "test_approx: the values differ"],
    ),
    (
        "frule-off-by-1.001x",
        test_frule,
        lambda: (sin_frule(1.001), (X64,), FAST),
        ["test_frule(mysin)", "tangent does not match finite differences", "argument: the output",
         "relative error 0.000999"],
    ),
    (
        "frule-rrule-not-transposes",
        test_frule,
        lambda: (sin_both(rrule_scale=1.001), (X64,), FAST),
        ["the frule and the rrule are not transposes of each other", "<y_bar, frule(x_dot)>",
         "<rrule(y_bar), x_dot>"],
    ),
    (
        "test_scalar-missing-conj",
        test_scalar,
        lambda: (with_rrule("csquare", lambda z: z * z, lambda y_bar, z: (NoTangent(), y_bar * 2 * z)),
                 (0.3 + 0.4j,), FAST),
        ["test_scalar(csquare)", "the partial d(Re y)/d(Im z) does not match finite differences",
         "expected: -0.8 (finite differences)", "got:      0.8 (rule)"],
    ),
    (
        "fast-mode-1.001x",
        test_rrule,
        lambda: (sin_rule(1.001), (X64,), dict(FAST, mode="fast")),
        ["cotangent does not match finite differences along", "argument: argument 1", "relative error 0.000999"],
    ),
    (
        "fast-mode-1e-6-on-10^4-elements",
        test_rrule,
        lambda: (sin_rule(1.0 + 1e-6), (BIG,), dict(FAST, mode="fast")),
        ["cotangent does not match finite differences along", "argument: argument 1", "relative error 1e-06"],
    ),
    (
        "auto-mode-1e-6-on-10^4-elements",
        test_rrule,
        lambda: (sin_rule(1.0 + 1e-6), (BIG,), FAST),
        ["cotangent does not match finite differences along", "argument: argument 1", "relative error 1e-06"],
    ),
    (
        "inplaceable-thunk-add-fn-disagrees",
        test_rrule,
        lambda: (with_rrule("double", lambda x: 2.0 * x, _bad_inplaceable_pullback), (X64,), FAST),
        ["InplaceableThunk: add_fn(acc) differs from acc + val", "argument: argument 1"],
    ),
    (
        "wrong-only-when-traced",
        test_rrule,
        lambda: (with_rrule("mysin", jnp.sin, _traced_wrong_pullback), (X64,), dict(check_vmap=False)),
        ["test_rrule(mysin): the pullback's cotangent differs under jax.jit from its eager value",
         "argument: argument 1", "relative error 0.000999"],
    ),
    (
        # evaluated eagerly (check_jit=False), the rule is right; the lowered primitive is not checked
        "wrong-only-when-traced-eager-evaluation",
        test_rrule,
        lambda: (with_rrule("mysin", jnp.sin, _traced_wrong_pullback), (X64,), dict(check_jit=False)),
        ["test_rrule(mysin): jax.vmap: batched differs from looped", "relative error 0.000999"],
    ),
    (
        "vmap-batched-differs-from-looped",
        test_rrule,
        lambda: (
            with_rrule("scaled", lambda x: x * jnp.sum(x),
                       lambda y_bar, x: (NoTangent(), y_bar * jnp.sum(x) + _total(y_bar * x))),
            (X64,),
            {},
        ),
        ["test_rrule(scaled)", "jax.vmap: batched differs from looped (batch element 0)"],
    ),
    (
        "vmap-batched-differs-from-looped-at-the-second-element",
        test_rrule,
        lambda: (with_rrule("mysin", jnp.sin, lambda y_bar, x: (NoTangent(), _first_of_batch(y_bar) * jnp.cos(x))),
                 (X64,), {}),
        ["test_rrule(mysin)", "jax.vmap: batched differs from looped (batch element 1)"],
    ),
]


@pytest.mark.parametrize("tester, factory, needles", [c[1:] for c in WRONG], ids=[c[0] for c in WRONG])
def test_wrong_rule_fails_with_a_specific_message(tester, factory, needles):
    f, args, kwargs = factory()
    with pytest.raises(AssertionError) as info:
        tester(f, *args, **kwargs)
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in:\n{message}"


# A derivative smaller than the default atol: that atol is absolute (1e-10 in float64), so a rule
# of a function of scale 1e-12 passed however wrong (exact mode). Where the finite differences
# resolve the difference (a finer method agrees with them to far better), it now fails; where
# they cannot, the default atol stands (in fast mode too, which had no atol to speak of).
def _tiny(derivative):
    return (lambda x: 1e-12 * jnp.sin(x)), (lambda x: 1e-12 * derivative(x))


@pytest.mark.parametrize("tester", ["rrule", "frule"])
def test_a_wrong_rule_of_a_small_function_fails_though_the_default_atol_is_larger(tester):
    def rule(derivative):
        f, df = _tiny(derivative)
        if tester == "rrule":
            return with_rrule("tiny", f, lambda y_bar, x: (NoTangent(), y_bar * df(x))), test_rrule
        return with_frule("tiny", f, lambda dots, x: df(x) * dots[0]), test_frule

    wrong, check = rule(jnp.sin)  # sin for cos
    with pytest.raises(AssertionError, match="by less than the default atol=1e-10, but more than their estimated"):
        check(wrong, X64)
    check(wrong, X64, atol=1e-10)  # an atol given is the user's: kept
    if tester == "rrule":
        with pytest.raises(AssertionError, match="along the rule's own cotangent"):
            check(wrong, X64, mode="fast")
    check(rule(jnp.cos)[0], X64)
    check(rule(jnp.cos)[0], X64 * 1e-4)
    wrong32, _ = rule(lambda x: 1.01 * jnp.cos(x))  # float32: 1% wrong at scale 1e-12, under its atol of 1e-6
    with pytest.raises(AssertionError, match="but more than their estimated error"):
        check(wrong32, X32)


def test_a_small_derivative_finite_differences_cannot_resolve_keeps_the_default_atol():
    # (a - b)^2 with a ~ b ~ 1: the output is 1e-20, the differences of f carry the rounding of a
    # and b (1e-16), far more than the derivative's size (1e-10): the default atol stays
    def resid(x):
        return jnp.sum((jnp.cos(x) - jnp.cos(x + 1e-10)) ** 2)

    def pullback(y_bar, x):
        return NoTangent(), y_bar * 2 * (jnp.cos(x) - jnp.cos(x + 1e-10)) * (jnp.sin(x + 1e-10) - jnp.sin(x))

    for mode in ("exact", "fast"):  # fast mode failed it: its directions are scaled by the rule's own x_bar
        test_rrule(with_rrule("resid", resid, pullback), X64, mode=mode)


def test_vmap_only_wrong_rule_passes_with_check_vmap_off():
    """The vmap case above is caught by the vmap check alone: eager and jit agree with the rule."""
    f = with_rrule("scaled", lambda x: x * jnp.sum(x),
                   lambda y_bar, x: (NoTangent(), y_bar * jnp.sum(x) + _total(y_bar * x)))
    report = test_rrule(f, X64, check_vmap=False)
    assert "jax.jit(jax.vjp)" in report.checks and "jax.vmap" not in report.checks


def test_partial_check_names_the_partial():
    """test_scalar's last check compares all four real partials; its message names the partial.

    (Through `test_scalar` a missing conj is caught earlier by `test_rrule`; the partial check
    is reached directly here.)
    """
    f = with_rrule("csquare", lambda z: z * z, lambda y_bar, z: (NoTangent(), y_bar * 2 * z))
    with pytest.raises(AssertionError, match=r"the partial d\(Re y\)/d\(Im z\) does not match finite differences"):
        _check_partials(f, 0.3 + 0.4j, False, True, None, None, None)


# ------------------------------------------------------------------------------------------
# Correct rules: each must pass, with a small error
# ------------------------------------------------------------------------------------------


class Point(NamedTuple):
    x: jax.Array
    y: jax.Array


def _unary(name, fn, d):
    return with_rrule(name, fn, lambda y_bar, x: (NoTangent(), y_bar * jnp.conj(d(x))))


def _inv_pullback(y_bar, a):
    y = jnp.linalg.inv(a)
    return NoTangent(), -y.T @ y_bar @ y.T


def _solve_pullback(y_bar, a, b):
    x = jnp.linalg.solve(a, b)
    b_bar = jnp.linalg.solve(a.T, y_bar)
    return NoTangent(), -jnp.outer(b_bar, x), b_bar


def _index_pullback(y_bar, x, idx):
    return NoTangent(), jnp.zeros_like(x).at[idx].add(y_bar), NoTangent()


def _inplaceable_pullback(y_bar, x):
    value = Thunk(lambda: 2.0 * y_bar)
    return NoTangent(), InplaceableThunk(lambda acc: acc + 2.0 * y_bar, value)


_erfcx = rules.external(scipy.special.erfcx, lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)))


@_erfcx.rrule
def _erfcx_rrule(x):
    y = _erfcx(x)

    def erfcx_pullback(y_bar):  # d/dx erfcx(x) = 2 x erfcx(x) - 2/sqrt(pi)
        return NoTangent(), y_bar * (2 * x * y - 2 / jnp.sqrt(jnp.pi))

    return y, erfcx_pullback


# (id, factory -> (f, args, kwargs), expected mode)
CORRECT = [
    ("sin", lambda: (_unary("mysin", jnp.sin, jnp.cos), (X64,), {}), "exact"),
    ("exp", lambda: (_unary("myexp", jnp.exp, jnp.exp), (X64,), {}), "exact"),
    ("log", lambda: (_unary("mylog", jnp.log, lambda x: 1 / x), (jnp.array([0.5, 1.5, 3.0]),), {}), "exact"),
    ("tanh", lambda: (_unary("mytanh", jnp.tanh, lambda x: 1 - jnp.tanh(x) ** 2), (X64,), {}), "exact"),
    ("sin-0d", lambda: (_unary("mysin", jnp.sin, jnp.cos), (jnp.asarray(0.4),), {}), "exact"),
    ("sin-python-float", lambda: (_unary("mysin", jnp.sin, jnp.cos), (0.4,), {}), "exact"),
    (
        "matmul",
        lambda: (
            with_rrule("matmul", lambda a, b: a @ b, lambda y_bar, a, b: (NoTangent(), y_bar @ b.T, a.T @ y_bar)),
            (A, B),
            {},
        ),
        "exact",
    ),
    ("inv", lambda: (with_rrule("inv", jnp.linalg.inv, _inv_pullback), (A,), {}), "exact"),
    ("solve", lambda: (with_rrule("solve", jnp.linalg.solve, _solve_pullback), (A, jnp.array([1.0, -2.0])), {}),
     "exact"),
    (
        "broadcast-reduced",
        lambda: (
            with_rrule("bmul", lambda a, b: a * b,
                       lambda y_bar, a, b: (NoTangent(), y_bar * b, jnp.sum(y_bar * a, axis=0, keepdims=True))),
            (jnp.arange(1.0, 5.0).reshape(2, 2), jnp.array([[0.5, -2.0]])),
            {},
        ),
        "exact",
    ),
    (
        "dict-argument",
        lambda: (
            with_rrule("affine", lambda p: p["w"] * p["b"],
                       lambda y_bar, p: (NoTangent(), {"w": y_bar * p["b"], "b": y_bar * p["w"]})),
            ({"w": X64, "b": X64 + 2.0},),
            {},
        ),
        "exact",
    ),
    (
        "dict-argument-Tangent-cotangent",
        lambda: (
            with_rrule("affine", lambda p: p["w"] * p["b"],
                       lambda y_bar, p: (NoTangent(), Tangent(dict, w=y_bar * p["b"], b=y_bar * p["w"]))),
            ({"w": X64, "b": X64 + 2.0},),
            {},
        ),
        "exact",
    ),
    (
        "NamedTuple-argument-partial-Tangent",
        lambda: (
            with_rrule("xsin", lambda p: jnp.sin(p.x) * 2.0,
                       lambda y_bar, p: (NoTangent(), Tangent(Point, x=2.0 * y_bar * jnp.cos(p.x)))),
            (Point(X64, X64 - 1.0),),
            {},
        ),
        "exact",
    ),
    (
        "tuple-output",
        lambda: (
            with_rrule("sincos", lambda x: (jnp.sin(x), jnp.cos(x)),
                       lambda y_bar, x: (NoTangent(), y_bar[0] * jnp.cos(x) - y_bar[1] * jnp.sin(x))),
            (X64,),
            {},
        ),
        "exact",
    ),
    ("complex-square", lambda: (_unary("csquare", lambda z: z**2, lambda z: 2 * z), (Z,), {}), "exact"),
    ("complex-exp", lambda: (_unary("cexp", jnp.exp, jnp.exp), (Z,), {}), "exact"),
    (
        "complex-abs2-real-output",
        lambda: (
            with_rrule("abs2", lambda z: jnp.real(z * jnp.conj(z)),
                       lambda y_bar, z: (NoTangent(), 2 * jnp.real(y_bar) * z)),
            (Z,),
            {},
        ),
        "exact",
    ),
    ("float32-sin", lambda: (_unary("mysin", jnp.sin, jnp.cos), (X32,), {}), "exact"),
    (
        "float32-matmul",
        lambda: (
            with_rrule("matmul", lambda a, b: a @ b, lambda y_bar, a, b: (NoTangent(), y_bar @ b.T, a.T @ y_bar)),
            (A.astype(jnp.float32), B.astype(jnp.float32)),
            {},
        ),
        "exact",
    ),
    ("complex64-exp", lambda: (_unary("cexp", jnp.exp, jnp.exp), (Z.astype(jnp.complex64),), {}), "exact"),
    (
        "python-int-exponent",
        lambda: (
            with_rrule("power", lambda x, n: x**n,
                       lambda y_bar, x, n: (NoTangent(), y_bar * n * x ** (n - 1), NoTangent())),
            (X64, 3),
            {},
        ),
        "exact",
    ),
    (
        "int-array-index",
        lambda: (with_rrule("take", lambda x, idx: x[idx], _index_pullback), (X64, jnp.array([2, 0])), {}),
        "exact",
    ),
    (
        # a float marked NoTangent is not differentiated: the rule says so with NoTangent()
        "with_tangent-NoTangent-excludes-a-float",
        lambda: (
            with_rrule("mul", lambda a, b: a * b, lambda y_bar, a, b: (NoTangent(), y_bar * b, NoTangent())),
            (X64, with_tangent(X64 + 1.0, NoTangent())),
            {},
        ),
        "exact",
    ),
    (
        "with_tangent-given-direction",
        lambda: (_unary("mysin", jnp.sin, jnp.cos), (with_tangent(X64, jnp.ones(3)),), {}),
        "exact",
    ),
    (
        "keyword-argument",
        lambda: (
            with_rrule("scale", lambda x, scale=1.0: scale * jnp.sin(x),
                       lambda y_bar, x, scale=1.0: (NoTangent(), scale * y_bar * jnp.cos(x))),
            (X64,),
            {"scale": 2.0},
        ),
        "exact",
    ),
    (
        "thunked-cotangents",
        lambda: (
            with_rrule("mul", lambda a, b: a * b,
                       lambda y_bar, a, b: (NoTangent(), Thunk(lambda: y_bar * b), Thunk(lambda: y_bar * a))),
            (X64, X64 + 1.0),
            {},
        ),
        "exact",
    ),
    ("inplaceable-thunk", lambda: (with_rrule("double", lambda x: 2.0 * x, _inplaceable_pullback), (X64,), {}),
     "exact"),
    ("scipy-external", lambda: (_erfcx, (jnp.array([0.5, 1.0, 2.0]),), {}), "exact"),
    ("fast-mode-auto-10^4", lambda: (_unary("mysin", jnp.sin, jnp.cos), (BIG,), {}), "fast"),
    ("fast-mode-forced", lambda: (_unary("mysin", jnp.sin, jnp.cos), (X64,), {"mode": "fast"}), "fast"),
]


@pytest.mark.parametrize("factory, mode", [c[1:] for c in CORRECT], ids=[c[0] for c in CORRECT])
def test_correct_rrule_passes(factory, mode):
    f, args, kwargs = factory()
    report = test_rrule(f, *args, **kwargs)
    assert isinstance(report, RuleReport)
    assert (report.kind, report.mode) == ("rrule", mode)
    low = any(
        np.dtype(jnp.result_type(leaf)).itemsize <= (8 if jnp.iscomplexobj(leaf) else 4)
        for a in args
        for leaf in jax.tree_util.tree_leaves(a.primal if isinstance(a, WithTangent) else a)
        if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)
    )
    assert report.max_error < (1e-4 if low else 1e-8)
    every = {"primal", "arity", "dtypes", "thunked seed", "jax.jit(jax.vjp)", "jax.vmap"}
    assert every <= set(report.checks) and f"finite differences ({mode})" in report.checks


def test_frule_only_passes_and_checks_the_lowered_jvp():
    report = test_frule(sin_frule(), X64)
    assert (report.kind, report.mode) == ("frule", "exact")
    assert report.max_error < 1e-8
    assert {"finite differences", "jax.jit(jax.jvp)", "jax.vmap"} <= set(report.checks)


def test_frule_report_says_fast_above_the_exact_limit_where_it_compares_along_x_dot():
    from rules.testing._testers import EXACT_MODE_LIMIT

    x = jnp.linspace(-1.0, 1.0, EXACT_MODE_LIMIT + 1)
    assert test_frule(sin_frule(), x).mode == "fast"
    assert test_frule(sin_frule(), x[:EXACT_MODE_LIMIT]).mode == "exact"


def test_frule_with_rrule_checks_transposition():
    report = test_frule(sin_both(), X64)
    assert report.max_error < 1e-8
    assert "frule/rrule transposition" in report.checks


def test_scalar_real_function_via_scalar_rule():
    @rules.primitive
    def mytanh(x):
        return jnp.tanh(x)

    rules.scalar_rule(mytanh, lambda x, y: 1 - y**2)
    reports = test_scalar(mytanh, 0.7)
    assert [r.kind for r in reports] == ["frule", "rrule"]
    assert max(r.max_error for r in reports) < 1e-8


def test_scalar_complex_function_via_scalar_rule():
    @rules.primitive
    def cexp(z):
        return jnp.exp(z)

    rules.scalar_rule(cexp, lambda z, y: y)
    reports = test_scalar(cexp, 0.3 - 0.5j)
    assert [r.kind for r in reports] == ["frule", "rrule", "frule", "rrule"]
    assert max(r.max_error for r in reports) < 1e-8


def test_scalar_compares_each_partial_relative_to_the_largest():
    """d(Re 1/z)/d(Re z) is 0 at 0.01 + 0.01j beside partials of 5000: the differences' rounding
    (~1e-9) is no failure, and a partial 1e-6 wrong is still one."""
    @rules.primitive
    def inv(z):
        return 1 / z

    rules.scalar_rule(inv, lambda z, y: -(y ** 2))
    test_scalar(inv, 0.01 + 0.01j)
    test_scalar(lambda z: 1 / z, 0.01 + 0.01j)  # JAX's own derivative
    rules.scalar_rule(inv, lambda z, y: -(y ** 2) * (1 + 1e-6))
    with pytest.raises(AssertionError, match="does not match finite differences"):
        test_scalar(inv, 0.01 + 0.01j)


def test_scalar_of_a_primitive_without_a_rule_says_so():
    """A primitive of ours without a rule asks for one; a plain function instead has JAX's own
    derivatives checked (tests/rules/testing/test_jax_functions.py)."""
    @rules.primitive
    def plain(x):
        return x

    with pytest.raises(AssertionError, match="no rule applies"):
        test_scalar(plain, 1.0)
    assert [r.kind for r in test_scalar(lambda x: 2 * x, 1.0)] == ["jax.jvp", "jax.vjp"]


def test_rrule_without_a_rule_says_how_to_register_one():
    """A primitive of ours without the rule asked for; a plain function instead has JAX's own
    derivative checked (tests/rules/testing/test_jax_functions.py)."""
    @rules.primitive
    def plain(x):
        return x

    with pytest.raises(AssertionError, match=r"no rrule applies(.|\n)*rules\.rrule\.register\(.*plain\)"):
        test_rrule(plain, X64)
    with pytest.raises(AssertionError, match="no frule applies"):
        test_frule(plain, X64)
    assert test_rrule(lambda x: x, X64).kind == "jax.vjp"


def test_bad_mode_raises_value_error():
    with pytest.raises(ValueError, match="mode must be 'auto', 'exact' or 'fast'"):
        test_rrule(sin_rule(), X64, mode="slow")


# ------------------------------------------------------------------------------------------
# __test__ = False: importing a tester into a test module collects nothing extra
# ------------------------------------------------------------------------------------------


def test_imported_testers_are_not_collected(tmp_path):
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            from rules.testing import test_approx, test_frule, test_rrule, test_scalar

            def test_real():
                test_approx(1.0, 1.0)
            """
        )
    )
    # a plain run, not an xdist worker (its PYTEST_XDIST_* variables would make plugins act as one)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-W", "error", "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_user.py::test_real" in proc.stdout
    assert "1 test collected" in proc.stdout, proc.stdout
    for tester in (test_rrule, test_frule, test_scalar, test_approx):
        assert tester.__test__ is False


# ------------------------------------------------------------------------------------------
# rand_tangent, test_approx, with_tangent
# ------------------------------------------------------------------------------------------


def test_rand_tangent_keeps_structure_and_dtypes():
    x = {
        "a": jnp.ones((2, 3), jnp.float32),
        "b": (jnp.ones(2, jnp.complex64), 1.5),
        "n": 3,
        "i": jnp.arange(2),
        "s": "name",
        "p": Point(jnp.zeros(2), jnp.zeros(())),
    }
    t = rand_tangent(x, seed=3)
    assert set(t) == set(x) and isinstance(t["b"], tuple) and len(t["b"]) == 2
    assert (t["a"].shape, t["a"].dtype) == ((2, 3), jnp.float32)
    assert t["b"][0].dtype == jnp.complex64 and np.all(np.imag(t["b"][0]) != 0)
    assert isinstance(t["b"][1], float)
    assert t["n"] == NoTangent() and t["i"] == NoTangent() and t["s"] == NoTangent()
    assert isinstance(t["p"], Point) and t["p"].y.shape == () and t["p"].x.dtype == jnp.float64


def test_rand_tangent_non_differentiable_value_and_seeds():
    assert rand_tangent(3) == NoTangent()
    assert rand_tangent((jnp.arange(3), True)) == NoTangent()
    x = jnp.zeros(4)
    np.testing.assert_array_equal(rand_tangent(x, seed=5), rand_tangent(x, seed=5))
    assert not np.array_equal(rand_tangent(x, seed=5), rand_tangent(x, seed=6))
    rng1, rng2 = np.random.default_rng(1), np.random.default_rng(1)
    np.testing.assert_array_equal(rand_tangent(x, seed=rng1), rand_tangent(x, seed=rng2))


def test_approx_understands_thunks_zeros_and_tangents():
    test_approx(Thunk(lambda: jnp.ones(2)), jnp.ones(2))
    test_approx(jnp.ones(2), Thunk(lambda: jnp.ones(2) + 1e-12))
    test_approx(ZeroTangent(), jnp.zeros(3))
    test_approx(jnp.zeros(3), NoTangent())
    test_approx(ZeroTangent(), NoTangent())
    test_approx(Tangent(dict, a=jnp.ones(2)), {"a": jnp.ones(2), "b": 0.0})
    test_approx(Tangent(Point, x=jnp.ones(2)), Tangent(Point, x=Thunk(lambda: jnp.ones(2))))
    test_approx(InplaceableThunk(lambda acc: acc + 1.0, Thunk(lambda: jnp.ones(2))), jnp.ones(2))
    test_approx(jnp.ones(2, jnp.float32), jnp.ones(2, jnp.float32) * (1 + 1e-6))  # float32 tolerance


def test_approx_failure_messages():
    with pytest.raises(AssertionError, match=r"the values differ at leaf \['b'\]: my note(.|\n)*expected:"):
        test_approx({"a": jnp.ones(2), "b": jnp.ones(2)}, {"a": jnp.ones(2), "b": jnp.ones(2) * 1.001}, "my note")
    with pytest.raises(AssertionError, match="the values differ"):
        test_approx(jnp.ones(2), jnp.ones(2) * (1 + 1e-6))  # float64 tolerance is tight
    with pytest.raises(AssertionError, match=r"field 'x'"):
        test_approx(Tangent(Point, x=jnp.ones(2)), Tangent(Point, x=jnp.zeros(2)))
    with pytest.raises(AssertionError, match="structures differ"):
        test_approx({"a": jnp.ones(2)}, {"a": jnp.ones(2), "b": jnp.ones(2)})
    test_approx(jnp.ones(2), jnp.ones(2) * 1.001, rtol=1e-2)


def test_with_tangent_marks_an_argument():
    w = with_tangent(X64, jnp.ones(3))
    assert isinstance(w, WithTangent) and w.primal is X64
    np.testing.assert_array_equal(w.tangent, jnp.ones(3))
    assert with_tangent(3, NoTangent()).tangent == NoTangent()


# ----- regressions: failures are AssertionErrors with the full location ------------------------
def test_an_inplaceable_thunk_inside_a_pytree_cotangent_is_named_by_its_path():
    prim = rules.primitive(lambda p: p["w"] * p["b"])

    @prim.rrule
    def prim_rrule(p):
        def prim_pullback(y_bar):
            y_bar = rules.unthunk(y_bar)
            wrong = InplaceableThunk(lambda acc: acc + 2 * y_bar * p["b"], Thunk(lambda: y_bar * p["b"]))
            return NoTangent(), {"w": wrong, "b": y_bar * p["w"]}

        return prim(p), prim_pullback

    x = jnp.array([1.0, 2.0])
    with pytest.raises(AssertionError, match=r"argument 1 \(p\) at path \['w'\]"):
        test_rrule(prim, {"w": x, "b": x + 2}, check_jit=False, check_vmap=False)


def test_a_pullback_that_cannot_be_traced_fails_as_an_assertion():
    prim = rules.primitive(lambda x: jnp.sin(x))

    @prim.rrule
    def prim_rrule(x):
        def prim_pullback(y_bar):
            return NoTangent(), rules.unthunk(y_bar) * np.cos(x)  # NumPy on a traced value

        return prim(x), prim_pullback

    with pytest.raises(AssertionError, match="failed under a JAX transformation"):
        test_rrule(prim, jnp.array([0.1, 0.2]))


def test_approx_counts_equal_infinities_as_equal():
    test_approx(jnp.array([-np.inf, 0.4]), jnp.array([-np.inf, 0.4]))
    with pytest.raises(AssertionError):
        test_approx(jnp.array([np.inf, 0.4]), jnp.array([-np.inf, 0.4]))


def test_rrule_and_frule_checks_of_one_small_function_share_one_finite_difference_evaluation(count_compiles):
    """test_rrule's exact check compiles f's evaluation at the basis points; test_frule of
    the same function evaluates its direction's points by that compilation, padded to its
    batch, instead of compiling its own."""
    rows, along = count_compiles("_rows"), count_compiles("_along")
    f = with_rrule("mycube", lambda x: x**3, lambda y_bar, x: (NoTangent(), 3 * x**2 * y_bar))
    add_frule(f, lambda dots, x: 3 * x**2 * dots[0])
    test_rrule(f, X64)
    test_frule(f, X64)
    assert len(rows) == 1 and len(along) == 0
    wrong = add_frule(with_rrule("mycube2", lambda x: x**3, lambda y_bar, x: (NoTangent(), 3 * x**2 * y_bar)),
                      lambda dots, x: 3.003 * x**2 * dots[0])
    test_rrule(wrong, X64)
    with pytest.raises(AssertionError, match="tangent does not match finite differences"):
        test_frule(wrong, X64)


def test_repeated_checks_of_one_function_compile_its_finite_differences_once(count_compiles):
    """The second test_rrule of the same function reuses the compiled evaluation (with its
    new input), and a wrong rule defined later for that function is still caught."""
    compiled = count_compiles("_along")

    @rules.primitive
    def cubic(x):  # a function no other test differences
        return x**3 - x

    def define_rule(scale):
        @cubic.rrule
        def cubic_rrule(x):
            return cubic(x), lambda y_bar: (NoTangent(), scale * y_bar * (3 * x**2 - 1))

    define_rule(1.0)
    for x in (X64, X64 + 1.0):
        test_rrule(cubic, x, mode="fast", **FAST)
    assert len(compiled) == 1
    define_rule(1.001)
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(cubic, X64, mode="fast", **FAST)


def test_test_rrule_checks_forward_mode_through_the_transposed_pullback_and_reports_the_modes():
    cube = with_rrule("cube_modes", lambda x: x**3, lambda y_bar, x: (NoTangent(), 3 * x**2 * y_bar))
    report = test_rrule(cube, X64)
    assert report.modes == "fwd+rev" and "jax.jvp (transposed pullback)" in report.checks

    looped = with_rrule(
        "looped_modes",
        lambda x: 2 * x,
        lambda y_bar, x: (NoTangent(), jax.lax.while_loop(lambda c: c[0] < 1, lambda c: (c[0] + 1, 2 * c[1]), (0, y_bar))[1]),
    )
    report = test_rrule(looped, X64)  # a pullback JAX cannot transpose: reverse mode only, not a failure
    assert report.modes == "rev" and not any("jvp" in c for c in report.checks)


# ------------------------------------------------------------------------------------------
# Parity with ChainRulesTestUtils (issue 13): behaviour the upstream ports rely on
# ------------------------------------------------------------------------------------------


def test_the_vmap_checks_keep_the_second_point_inside_the_domain():
    """arccos near its domain's edge: the batch's second point must not leave [-1, 1]."""
    x = jnp.array([0.99, -0.98, 0.97])
    assert "jax.vmap" in test_rrule(jnp.arccos, x).checks
    assert "jax.vmap" in test_frule(jnp.arccos, x).checks


def test_scalar_complex_input_with_a_zero_tangent():
    """A rule whose tangent (cotangent) is `ZeroTangent()` at a complex point: all partials 0."""
    const = fresh_primitive("const", lambda z: jnp.asarray(2.0 + 1.0j) + 0 * z)
    add_frule(const, lambda dots, z: ZeroTangent())
    rules.rrule.register(const, lambda z: (const(z), lambda y_bar: (NoTangent(), ZeroTangent())))
    assert [r.kind for r in test_scalar(const, 0.3 + 0.4j, **FAST)] == ["frule", "rrule", "frule", "rrule"]


def test_scalar_requires_a_real_tangent_to_act_as_the_complex_one():
    """ChainRulesTestUtils' test_scalar: tangent 1.0 and 1.0 + 0.0im give the same result."""
    f = fresh_primitive("csquare", lambda z: z * z)
    add_frule(f, lambda dots, z: 2 * z * dots[0] * (1.0 if jnp.iscomplexobj(dots[0]) else 2.0))
    with pytest.raises(AssertionError, match=r"the frule gives a different tangent for a real 1.0 than for 1.0 \+ 0"):
        test_scalar(f, 0.3 + 0.4j, **FAST)


def test_scalar_passes_keyword_arguments_to_the_function_only():
    """test_scalar's own options go to the testers; the rest reach f and its rules."""
    seen = []

    def scaled(x, scale=1.0):
        seen.append(scale)
        return scale * jnp.sin(x)

    f = with_rrule("scaled", scaled, lambda y_bar, x, scale=1.0: (NoTangent(), scale * y_bar * jnp.cos(x)))
    test_scalar(f, 0.4, scale=3.0, check_jit=False, check_vmap=False, mode="exact")
    assert seen and set(seen) == {3.0}


def test_a_callable_struct_is_checked_by_its_rule_but_not_lowered():
    """JAX differentiates a primitive's arguments, never the function: with a tangent for f,
    the lowered primitive is not checked, and the report says so."""

    class Scale(NamedTuple):
        c: float

        def __call__(self, x):
            return self.c * x

    scale = Scale(1.5)
    def scale_rrule(x):
        return scale(x), lambda y_bar: (Tangent(Scale, c=jnp.sum(y_bar * x)), scale.c * y_bar)

    rules.rrule.register(scale, scale_rrule, plain=True)
    report = test_rrule(scale, X64)
    assert any(c.startswith("lowered primitive not checked") for c in report.checks)
    other = Scale(2.5)  # no rule: the primitive lowers to JAX's own derivative
    report = test_rrule(with_tangent(other, NoTangent()), X64,
                        rrule_f=lambda f, x: (f(x), lambda y_bar: (NoTangent(), f.c * y_bar)))
    assert "jax.jit(jax.vjp)" in report.checks


def test_an_unhashable_callable_has_no_rule_but_can_be_tested_through_rrule_f():
    @dataclasses.dataclass
    class Scale:  # eq=True without frozen=True: unhashable, so no rule can be registered on it
        c: float

        def __call__(self, x):
            return self.c * x

    scale = Scale(2.0)
    assert test_rrule(scale, X64, **FAST).kind == "jax.vjp"  # JAX's own derivative, f_bar included
    report = test_rrule(scale, X64, rrule_f=lambda f, x: (f(x), lambda y_bar: (NoTangent(), f.c * y_bar)))
    assert any("f is unhashable" in c for c in report.checks)


# ------------------------------------------------------------------------------------------
# Compiled checks, kept across calls
# ------------------------------------------------------------------------------------------


def test_a_second_check_of_the_same_code_reuses_its_compilations_with_the_new_values():
    """A repeated check of the same code at arguments of the same shapes traces again and
    runs the first call's compiled programs (nothing compiled again), on the new values: a
    rule wrong only for negative x passes at positive x and then fails at negative x."""
    from rules.testing import _compiled

    f = with_rrule("mysin", jnp.sin,
                   lambda y_bar, x: (NoTangent(), y_bar * jnp.cos(x) * jnp.where(x < 0, 1.01, 1.0)))
    positive = jnp.abs(X64)
    test_rrule(f, positive)
    before = dict(_compiled.stats)
    test_rrule(f, positive * 0.5)
    assert _compiled.stats["compiled"] == before["compiled"]
    assert _compiled.stats["reused"] > before["reused"]
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(f, -positive)
    assert _compiled.stats["compiled"] == before["compiled"]


def test_each_tester_call_compiles_one_program_with_the_lowered_checks_in_it(monkeypatch):
    """The rule with its conventions, the lowered primitive under jax.jit batched over two
    points (the second's unbatched value: the same program run there), and forward mode by the transposed pullback: one compiled program per call
    (lowering and compiling one costs ~25 ms however small it is)."""
    from rules.testing import _compiled

    monkeypatch.setattr(_compiled, "_EXECUTABLES", _compiled.Kept(8))  # none kept from other tests

    cube = with_rrule("one_program", lambda x: x**3, lambda y_bar, x: (NoTangent(), 3 * x**2 * y_bar))
    before = _compiled.stats["checks compiled"]
    report = test_rrule(cube, X64)
    assert _compiled.stats["checks compiled"] == before + 1
    assert {"jax.jit(jax.vjp)", "jax.vmap", "jax.jvp (transposed pullback)"} <= set(report.checks)

    square = add_frule(fresh_primitive("one_program_f", lambda x: x * x), lambda dots, x: 2 * x * dots[0])
    before = _compiled.stats["checks compiled"]
    report = test_frule(square, X64)
    assert _compiled.stats["checks compiled"] == before + 1
    assert {"jax.jit(jax.jvp)", "jax.vmap"} <= set(report.checks)


def test_large_inputs_are_checked_in_one_program_with_the_seed_an_argument(monkeypatch):
    """Above a few thousand elements too, the rule and the lowered checks are one compiled
    program per call: the random seeds (test_rrule's y_bar, test_frule's for the transposition
    check) are made before the trace, from f's output shapes, and passed in, not constants
    of the program, so another seed runs the same compilations. A wrong rule still fails."""
    from rules.testing import _compiled

    monkeypatch.setattr(_compiled, "_EXECUTABLES", _compiled.Kept(16))
    x = jnp.linspace(0.5, 1.5, 5000)
    cube = with_rrule("one_large_program", lambda x: x**3, lambda y_bar, x: (NoTangent(), 3 * x**2 * y_bar))
    before = _compiled.stats["checks compiled"]
    test_rrule(cube, x)
    assert _compiled.stats["checks compiled"] == before + 1
    compiled = _compiled.stats["compiled"]
    test_rrule(cube, x, seed=1)
    assert _compiled.stats["compiled"] == compiled
    square = add_frule(with_rrule("large_f", lambda x: x * x, lambda y_bar, x: (NoTangent(), 2 * x * y_bar)),
                       lambda dots, x: 2 * x * dots[0])
    before = _compiled.stats["checks compiled"]
    assert "transposition" in " ".join(test_frule(square, x).checks)
    assert _compiled.stats["checks compiled"] == before + 1
    compiled = _compiled.stats["compiled"]
    test_frule(square, x, seed=1)
    assert _compiled.stats["compiled"] == compiled
    wrong = with_rrule("large_wrong", lambda x: x**3, lambda y_bar, x: (NoTangent(), 3.03 * x**2 * y_bar))
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(wrong, x)
    alone = add_frule(fresh_primitive("large_frule_only", lambda x: x * x), lambda dots, x: 2 * x * dots[0])
    assert {"jax.jit(jax.jvp)", "jax.vmap"} <= set(test_frule(alone, x).checks)
    # the second point's unbatched value is computed in the program here: a batching error fails
    seeded = with_rrule("large_seeded", jnp.sin, lambda y_bar, x: (NoTangent(), _first_of_batch(y_bar) * jnp.cos(x)))
    with pytest.raises(AssertionError, match=r"jax.vmap: batched differs from looped \(batch element 1\)"):
        test_rrule(seeded, x)


def test_the_vmap_checks_second_point_runs_the_rules_own_program_again(monkeypatch):
    """The jax.vmap check's unbatched value at its second point is the rule's program run
    there (no second program): also where the first move leaves f's domain (arccos next to
    1) and shorter ones are tried. A batching error at that point still fails (the
    callback below gives every batch element element 0's seed: the second's is doubled)."""
    from rules.testing import _compiled

    monkeypatch.setattr(_compiled, "_EXECUTABLES", _compiled.Kept(8))
    arccos = with_rrule("near_one", jnp.arccos, lambda y_bar, x: (NoTangent(), -y_bar / jnp.sqrt(1 - x**2)))
    before = _compiled.stats["checks compiled"]
    report = test_rrule(arccos, jnp.full(6, 1 - 1e-5))
    assert _compiled.stats["checks compiled"] == before + 1
    assert "jax.vmap" in report.checks
    seeded = with_rrule("seeded", jnp.sin, lambda y_bar, x: (NoTangent(), _first_of_batch(y_bar) * jnp.cos(x)))
    with pytest.raises(AssertionError, match=r"jax.vmap: batched differs from looped \(batch element 1\)"):
        test_rrule(seeded, jnp.full(6, 1 - 1e-5))


def test_the_vmap_checks_second_point_moves_only_the_arguments_the_batch_moves():
    """With one cotangent not implemented (not lowered, not batched), the rule's program run at
    the second point moved that argument too: a correct rule failed "batched differs from
    looped" at x + y. A batching error in the other cotangent still fails."""
    from rules import not_implemented

    def pullback(y_bar, x, y, wrong=False):
        a, b = y_bar
        return NoTangent(), not_implemented("") * a, (_first_of_batch(a) if wrong else a) * jnp.cos(y)

    for wrong in (False, True):
        f = with_rrule(f"half_done_{wrong}", lambda x, y: (x + jnp.sin(y), x * 2), functools.partial(pullback, wrong=wrong))
        if not wrong:
            assert "jax.vmap" in test_rrule(f, jnp.full(3, 0.3), jnp.full(3, 0.7)).checks
            continue
        with pytest.raises(AssertionError, match=r"jax.vmap: batched differs from looped \(batch element 1\)"):
            test_rrule(f, jnp.full(3, 0.3), jnp.full(3, 0.7))


def test_a_compiled_checks_program_refuses_arguments_it_was_not_traced_for():
    """`_compiled.Program` runs its one trace at other array values only: another shape,
    dtype or fixed value must be traced anew, never run by this executable."""
    from rules.testing import _compiled

    program = _compiled.Program(lambda x, k: x * k, np.ones(3), 2.0)
    np.testing.assert_allclose(program(np.full(3, 4.0), 2.0), np.full(3, 8.0))
    for args in [(np.ones(4), 2.0), (np.ones(3, np.float32), 2.0), (np.ones(3), 3.0), ((np.ones(3),), 2.0)]:
        with pytest.raises(ValueError, match="trace it anew"):
            program(*args)


def test_a_perturbed_python_number_reaches_the_rules_traced_as_under_jax_jit():
    """A Python float or complex argument is a weakly typed argument of the checks' programs,
    as jax.jit traces one, not a constant folded into them (XLA folds some functions otherwise
    than it computes them: test_jax_functions' complex tan near pi/2); an int stays as given."""
    seen = []

    def record(x, n):
        seen.append((x, n))
        return n * x ** (n - 1)

    power = with_rrule("power_of_number", lambda x, n: x**n if n > 1 else x, lambda y_bar, x, n: (
        NoTangent(), y_bar * jnp.conj(record(x, n)), NoTangent()))
    add_frule(power, lambda dots, x, n: dots[0] * record(x, n))
    for z in (1.5, 1.5 + 0.5j):
        seen.clear()
        test_rrule(power, z, 3)
        test_frule(power, z, 3)
        assert seen and all(isinstance(x, jax.core.Tracer) for x, _ in seen)
        assert any(jax.typeof(x).weak_type for x, _ in seen)  # unbatched: as jax.jit(f)(z) traces z
        assert all(type(n) is int for _, n in seen)
    square = fresh_primitive("square_of_a_float", lambda x: x * x)
    rules.rrule.register(square, lambda x: (square(x), lambda y_bar: (NoTangent(), 2 * x * y_bar)), types=(float,))
    for check_jit in (True, False):  # traced, it dispatches as the float; eagerly, it is the float
        assert "finite differences (exact)" in test_rrule(square, 1.5, check_jit=check_jit).checks


def test_an_frule_wrong_only_under_vmap_fails_from_the_rules_own_program():
    """The frule's jax.jvp under vmap, evaluated in the rule's program, still fails as
    batched differs from looped."""
    scaled = add_frule(fresh_primitive("scaled_f", lambda x: x * jnp.sum(x)),
                       lambda dots, x: dots[0] * jnp.sum(x) + x * _total(dots[0]))
    test_frule(scaled, X64, check_vmap=False)  # right where nothing is batched
    with pytest.raises(AssertionError, match=r"jax.vmap: batched differs from looped \(batch element 0\)"):
        test_frule(scaled, X64)


def test_quick_compile_options_unknown_to_xla_are_left_out_not_fatal():
    """XLA renames and retires its debug options; a check must still compile where one of
    ours is gone (it is left out), with the options XLA has."""
    from rules.testing import _compiled

    kept = _compiled._accepted({"xla_backend_optimization_level": 0, "xla_no_such_option_zj": True})
    assert kept == {"xla_backend_optimization_level": 0}
    if jax.default_backend() == "cpu":  # each option kept exactly where this XLA knows it
        quick = _compiled._quick_options()
        assert quick == {k: v for k, v in _compiled._QUICK_OPTIONS.items() if _compiled._accepted({k: v})}
        assert "xla_backend_optimization_level" in quick  # jaxlib 0.11.2 retired the emitter option only


def test_a_quickly_compiled_program_computes_what_the_default_compilation_does():
    """The quick options change how CPU code is generated, not what it computes: the same
    transcendental-heavy program agrees with the default compilation to the last bits (an
    ulp or two of the output's scale; level 0 alone already moves about half the elements
    by one)."""
    from rules.testing import _compiled

    def program(x):
        return jnp.tanh(jnp.exp(jnp.sin(x)) * jnp.log1p(x * x)) + jax.scipy.special.erf(x) ** 3

    for dtype in (jnp.float32, jnp.float64):
        x = jnp.linspace(-3.0, 3.0, 64, dtype=dtype)
        quick, default = _compiled.jit(program)(x), jax.jit(program)(x)
        scale = float(jnp.max(jnp.abs(default)))
        assert float(jnp.max(jnp.abs(quick - default))) <= 4 * np.finfo(dtype).eps * scale


def test_a_helper_changed_since_the_last_check_is_checked_as_it_is_now(monkeypatch):
    """Nothing stale: a rule calling a module-level helper that changes between two checks
    (a notebook cell run again, a monkeypatch) is checked with the new helper."""
    import types

    helpers = types.SimpleNamespace(scale=lambda: 1.0)
    f = with_rrule("mysin", jnp.sin, lambda y_bar, x: (NoTangent(), helpers.scale() * y_bar * jnp.cos(x)))
    test_rrule(f, X64)
    monkeypatch.setattr(helpers, "scale", lambda: 1.01)
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(f, X64)


def test_a_program_is_reused_only_with_the_same_constants_compiled_into_it(monkeypatch):
    """Arrays a rule closes over are compiled into its program: the same jaxpr with other
    values is compiled anew, not run with the old ones."""
    import types

    from rules.testing import _compiled

    helpers = types.SimpleNamespace(scale=np.ones(3))
    f = with_rrule("mysin", jnp.sin, lambda y_bar, x: (NoTangent(), helpers.scale * y_bar * jnp.cos(x)))
    test_rrule(f, X64)
    compiled = _compiled.stats["compiled"]
    test_rrule(f, X64)  # the same constants: reused
    assert _compiled.stats["compiled"] == compiled
    monkeypatch.setattr(helpers, "scale", np.full(3, 1.01))  # the same jaxpr, another constant
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(f, X64)


def test_a_rule_closing_over_a_typed_prng_key_is_checked_and_its_program_keyed_by_the_key():
    """A typed PRNG key has no NumPy view: it keys the program by its key data, so a rule
    closing over one is checked (no false failure of the lowered checks), and another key
    gives another program, not the first one's values."""
    from rules.testing import _compiled

    def noisy(key):
        return with_rrule("noisy", lambda x: x * jax.random.uniform(key, x.shape, x.dtype, 1.0, 2.0),
                          lambda y_bar, x: (NoTangent(), y_bar * jax.random.uniform(key, x.shape, x.dtype, 1.0, 2.0)))

    report = test_rrule(noisy(jax.random.key(0)), X64)
    assert "jax.jit(jax.vjp)" in report.checks
    body = lambda x, key=jax.random.key(1): x + jax.random.normal(key, x.shape)  # noqa: E731
    other = lambda x, key=jax.random.key(2): x + jax.random.normal(key, x.shape)  # noqa: E731
    first, second = _compiled.run(body, jnp.zeros(3)), _compiled.run(other, jnp.zeros(3))
    np.testing.assert_allclose(first, jax.random.normal(jax.random.key(1), (3,)), rtol=1e-12)
    np.testing.assert_allclose(second, jax.random.normal(jax.random.key(2), (3,)), rtol=1e-12)


def test_programs_that_print_alike_keep_their_own_arguments_and_result_types():
    """The module's text does not say which arguments an executable reads (JAX drops the
    unused ones) nor whether a result is weakly typed: two programs alike in text but not in
    those each run as traced (scenarios of whole checks: test_never_stale.py)."""
    from rules.testing import _compiled

    a, b = jnp.array([1.0, 2.0]), jnp.array([5.0, 7.0])
    np.testing.assert_array_equal(_compiled.run(lambda x, y: x * 2, a, b), a * 2)
    np.testing.assert_array_equal(_compiled.run(lambda x, y: y * 2, a, b), b * 2)
    weak, strong = jnp.asarray(2.0), jnp.array(2.0, dtype=jnp.float64)
    assert _compiled.run(lambda x: x * 2, weak).weak_type
    assert not _compiled.run(lambda x: x * 2, strong).weak_type


def test_kept_programs_check_the_values_of_each_call():
    """Same signature, new values: a rule wrong only for negative inputs passes at positive
    ones and fails at negative ones, whatever ran before."""
    f = with_rrule("mysin", jnp.sin,
                   lambda y_bar, x: (NoTangent(), y_bar * jnp.cos(x) * jnp.where(x < 0, 1.01, 1.0)))
    positive = jnp.array([0.3, 1.2, 0.7])
    test_rrule(f, positive)
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(f, -positive)
    test_rrule(f, positive)


def test_a_redefined_rule_is_checked_not_its_kept_program():
    f = sin_rule()
    test_rrule(f, X64)

    @f.rrule
    def wrong(x):
        return jnp.sin(x), lambda y_bar: (NoTangent(), 1.01 * rules.unthunk(y_bar) * jnp.cos(x))

    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(f, X64)


def test_auto_mode_is_exact_up_to_its_limit_and_fast_above():
    from rules.testing._testers import EXACT_MODE_LIMIT

    f = sin_rule()
    assert test_rrule(f, jnp.linspace(0.1, 1.0, EXACT_MODE_LIMIT)).mode == "exact"
    assert test_rrule(f, jnp.linspace(0.1, 1.0, EXACT_MODE_LIMIT + 1)).mode == "fast"


def test_programs_that_print_alike_but_call_different_host_functions_are_not_confused():
    """Two `external` primitives over different SciPy functions trace to jaxprs with the same
    text (the callbacks print alike); each check must run its own function."""

    def host(fn):
        like = lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))  # noqa: E731
        return lambda x: rules.external(fn, like, vmap_method="expand_dims", name="host")(x)

    x = jnp.array([0.3, 0.9, 1.7])
    for fn, derivative in ((np.sin, np.cos), (np.cosh, np.sinh)):  # the same program text
        f = fresh_primitive("hosted", host(fn))
        add_frule(f, lambda dots, x, d=host(derivative): d(x) * dots[0])
        test_frule(f, x)


# ------------------------------------------------------------------------------------------
# Never stale: every check traces the code as it is now; only compilations of the same
# lowered program are reused (rules/testing/_compiled.py)
# ------------------------------------------------------------------------------------------


def _user_module(name, source):
    """A module of user code (not a library: its functions' globals are walked), as a
    notebook or a test file defines it."""
    import types

    module = types.ModuleType(name)
    exec(textwrap.dedent(source), vars(module))
    return module


_USER_RULE = """
    import jax.numpy as jnp
    import numpy as np
    import rules

    SCALE = 1.0
    TABLE = np.ones(3)

    def helper(x):
        return jnp.cos(x)

    @rules.primitive
    def mysin(x):
        return jnp.sin(x)

    @mysin.rrule
    def mysin_rrule(x):
        return jnp.sin(x), lambda y_bar: (rules.NoTangent(), SCALE * TABLE * rules.unthunk(y_bar) * helper(x))
"""


@pytest.mark.parametrize("change", ["helper redefined", "global constant", "array changed in place",
                                    "library function patched", "rule registered again"])
def test_a_check_repeated_after_the_code_it_reads_changed_checks_the_new_code(change, monkeypatch):
    """A second check traces the rule again, so it sees every change to what the rule reads:
    a helper redefined (a notebook cell run again), a global constant rebound, a
    NumPy array changed in place, a function of JAX monkeypatched, a rule registered again.
    Each change here makes the rule wrong, and the second check must fail."""
    from rules.testing import _compiled

    module = _user_module(f"zj_user_{change.replace(' ', '_')}", _USER_RULE)
    test_rrule(module.mysin, X64)
    before = _compiled.stats["compiled"]
    test_rrule(module.mysin, X64)  # nothing changed: traced again, every compilation reused
    assert _compiled.stats["compiled"] == before
    if change == "helper redefined":
        exec("def helper(x):\n    return 1.01 * jnp.cos(x)\n", vars(module))
    elif change == "global constant":
        module.SCALE = 1.01
    elif change == "array changed in place":
        module.TABLE[1] = 1.01
    elif change == "library function patched":
        monkeypatch.setattr(jnp, "cos", lambda x: 1.01 * jnp.sin(x + jnp.pi / 2))
    else:
        module.mysin.rrule(lambda x: (jnp.sin(x), lambda y_bar: (NoTangent(), 1.01 * rules.unthunk(y_bar) * jnp.cos(x))))
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(module.mysin, X64)


def test_a_rule_reading_a_closure_or_an_object_attribute_that_changed_is_checked_as_it_is_now():
    """Closure cells and the attributes of user objects are read by value: rebinding a
    nonlocal or setting an attribute makes the next check trace anew."""
    factor = 1.0

    class Config:
        scale = 1.0

    config = Config()
    f = with_rrule("mysin", jnp.sin, lambda y_bar, x: (NoTangent(), factor * config.scale * y_bar * jnp.cos(x)))
    test_rrule(f, X64)
    factor = 1.01
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(f, X64)
    factor = 1.0
    test_rrule(f, X64)
    config.scale = 1.01
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(f, X64)
    config.scale = 1.0
    Config.scale = 1.01  # the class attribute is shadowed by the instance's: still right
    test_rrule(f, X64)


def test_finite_differences_of_a_function_whose_global_changed_use_the_new_function():
    """fd_jvp traces f on every call: a global f reads that changed is seen."""
    from rules.testing import central_fdm, fd_jvp

    module = _user_module("zj_user_fd", """
        import jax.numpy as jnp
        POWER = 2.0
        def f(x):
            return x ** POWER
    """)
    x, t = jnp.array([1.0, 3.0]), jnp.array([1.0, 1.0])
    np.testing.assert_allclose(fd_jvp(central_fdm(5, 1), module.f, (x,), (t,)), [2.0, 6.0], rtol=1e-8)
    module.POWER = 3.0
    np.testing.assert_allclose(fd_jvp(central_fdm(5, 1), module.f, (x,), (t,)), [3.0, 27.0], rtol=1e-8)


def test_a_large_random_draw_is_kept_and_equals_a_fresh_one():
    """rand_tangent's large draws are kept by the generator's state: the same values, the
    generator left where a fresh draw leaves it, and read-only (a caller cannot change
    what the next check gets)."""
    from rules.testing._compare import random_values

    shape = (1 << 15,)
    a_rng, b_rng = np.random.default_rng(5), np.random.default_rng(5)
    first = random_values(np.zeros(shape), a_rng)
    again = random_values(np.zeros(shape), b_rng)
    fresh = np.random.default_rng(5).standard_normal(shape)
    np.testing.assert_array_equal(first, fresh)
    np.testing.assert_array_equal(again, fresh)
    assert a_rng.bit_generator.state == b_rng.bit_generator.state
    assert a_rng.standard_normal() == b_rng.standard_normal()
    with pytest.raises(ValueError, match="read-only"):
        again[0] = 1.0


_CFG = """
    S = 1.0
    T = 1.0
"""

# How a rule may read a value (module zj_cfg's S, or T, or its own global S), and how the
# value changes: the rule is right before and 1% wrong after. Each was a stale reuse once.
_READS = {
    "a user module in a closure cell": ("""
        def make(cfg):
            def pullback_of(x):
                return lambda y_bar: (rules.NoTangent(), cfg.S * rules.unthunk(y_bar) * jnp.cos(x))
            return pullback_of
        pullback_of = make(CFG)
    """, lambda m, cfg: setattr(cfg, "S", 1.01)),
    "a user module as a default argument": ("""
        def pullback_of(x, cfg=CFG):
            return lambda y_bar: (rules.NoTangent(), cfg.S * rules.unthunk(y_bar) * jnp.cos(x))
    """, lambda m, cfg: setattr(cfg, "S", 1.01)),
    "a user module read by two functions": ("""
        cfg = CFG
        def other():
            return cfg.T
        def pullback_of(x):
            other()
            return lambda y_bar: (rules.NoTangent(), cfg.S * rules.unthunk(y_bar) * jnp.cos(x))
    """, lambda m, cfg: setattr(cfg, "S", 1.01)),
    "a module imported in the body": ("""
        def pullback_of(x):
            import zj_cfg_imported
            return lambda y_bar: (rules.NoTangent(), zj_cfg_imported.S * rules.unthunk(y_bar) * jnp.cos(x))
    """, lambda m, cfg: setattr(cfg, "S", 1.01)),
    "a module imported by its name's string": ("""
        def pullback_of(x):
            cfg = __import__("zj_cfg_imported")
            return lambda y_bar: (rules.NoTangent(), cfg.S * rules.unthunk(y_bar) * jnp.cos(x))
    """, lambda m, cfg: setattr(cfg, "S", 1.01)),
    "globals()": ("""
        S = 1.0
        def pullback_of(x):
            return lambda y_bar: (rules.NoTangent(), globals()["S"] * rules.unthunk(y_bar) * jnp.cos(x))
    """, lambda m, cfg: setattr(m, "S", 1.01)),
    "getattr on a module": ("""
        cfg = CFG
        def pullback_of(x):
            return lambda y_bar: (rules.NoTangent(), getattr(cfg, "S") * rules.unthunk(y_bar) * jnp.cos(x))
    """, lambda m, cfg: setattr(cfg, "S", 1.01)),
    "a helper wrapping a jax function": ("""
        import functools
        S = 1.0
        @functools.wraps(jnp.cos)
        def helper(x):
            return S * jnp.cos(x)
        def pullback_of(x):
            return lambda y_bar: (rules.NoTangent(), rules.unthunk(y_bar) * helper(x))
    """, lambda m, cfg: setattr(m, "S", 1.01)),
    "a metaclass __getattr__": ("""
        S = 1.0
        class Meta(type):
            def __getattr__(cls, name):
                return S
        class Holder(metaclass=Meta):
            pass
        def pullback_of(x):
            return lambda y_bar: (rules.NoTangent(), Holder.scale * rules.unthunk(y_bar) * jnp.cos(x))
    """, lambda m, cfg: setattr(m, "S", 1.01)),
    "a jitted class attribute": ("""
        import jax
        S = 1.0
        def _scale(v):
            return S * v
        class Ops:
            scale = jax.jit(_scale)
        def pullback_of(x):
            return lambda y_bar: (rules.NoTangent(), Ops.scale(rules.unthunk(y_bar) * jnp.cos(x)))
    """, lambda m, cfg: (setattr(m, "S", 1.01), jax.clear_caches())),
    "a class made by make_dataclass": ("""
        import dataclasses
        Cfg = dataclasses.make_dataclass("Cfg", [], namespace={"K": 1.0})
        def pullback_of(x):
            return lambda y_bar: (rules.NoTangent(), Cfg.K * rules.unthunk(y_bar) * jnp.cos(x))
    """, lambda m, cfg: setattr(m.Cfg, "K", 1.01)),
    "a jax.scipy function read by name": ("""
        import jax
        def pullback_of(x):
            return lambda y_bar: (rules.NoTangent(), rules.unthunk(y_bar) * jnp.cos(x)
                                  * jax.scipy.stats.norm.cdf(x) / jax.scipy.special.ndtr(x))
    """, lambda m, cfg: _patch_for_test(jax.scipy.stats.norm, "cdf", lambda v: 1.01 * jax.scipy.special.ndtr(v))),
    "a defaultdict's factory": ("""
        import collections
        TABLE = collections.defaultdict(lambda: 1.0)
        def pullback_of(x):
            return lambda y_bar: (rules.NoTangent(), TABLE["scale"] * rules.unthunk(y_bar) * jnp.cos(x))
    """, lambda m, cfg: (m.TABLE.clear(), setattr(m.TABLE, "default_factory", lambda: 1.01))),
    "a list subclass changed in place": ("""
        class Coefs(list):
            pass
        COEFS = Coefs([1.0])
        def pullback_of(x):
            return lambda y_bar: (rules.NoTangent(), COEFS[0] * rules.unthunk(y_bar) * jnp.cos(x))
    """, lambda m, cfg: m.COEFS.__setitem__(0, 1.01)),
}


_PATCHED: list = []  # (object, name, value) to restore after a test of `_READS`


def _patch_for_test(obj, name, value):
    _PATCHED.append((obj, name, getattr(obj, name)))
    setattr(obj, name, value)


@pytest.mark.parametrize("how", list(_READS))
def test_a_value_read_indirectly_that_changed_is_checked_as_it_is_now(how):
    """The ways code reads a value that a walk by global names alone misses: each change
    makes the rule wrong, and the next check must fail, not reuse the right rule's trace."""
    source, change = _READS[how]
    cfg = _user_module("zj_cfg_imported", _CFG)
    sys.modules["zj_cfg_imported"] = cfg
    try:
        module = types.ModuleType(f"zj_reads_{len(how)}")
        vars(module).update(CFG=cfg)
        exec("import jax.numpy as jnp\nimport rules\n" + textwrap.dedent(source) + textwrap.dedent("""
            @rules.primitive
            def mysin(x):
                return jnp.sin(x)

            @mysin.rrule
            def mysin_rrule(x):
                return jnp.sin(x), pullback_of(x)
        """), vars(module))
        test_rrule(module.mysin, X64)
        change(module, cfg)
        with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
            test_rrule(module.mysin, X64)
    finally:
        del sys.modules["zj_cfg_imported"]
        while _PATCHED:
            setattr(*_PATCHED.pop())


def test_a_pytree_argument_whose_class_changed_is_checked_as_it_is_now():
    """An argument of a user pytree class: its methods and class attributes are code the
    check runs, though no function names the class (the tree keys it by identity)."""

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class P:
        x: jax.Array
        K = 1.0

    f = with_rrule("pscale", lambda p: jnp.sin(p.x),
                   lambda y_bar, p: (NoTangent(), P(x=p.K * y_bar * jnp.cos(p.x))))
    test_rrule(f, P(X64))
    P.K = 1.01
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(f, P(X64))


def test_a_rule_that_warns_when_traced_warns_on_every_check():
    """A reused trace does not run the rule's Python code; the warnings its trace raised are
    raised again, so `pytest.warns` sees them whichever test checked the rule first."""

    def pullback(y_bar, x):
        import warnings

        warnings.warn("zj: this rule is approximate", UserWarning)
        return NoTangent(), y_bar * jnp.cos(x)

    f = with_rrule("warns", jnp.sin, pullback)
    for _ in range(2):
        with pytest.warns(UserWarning, match="zj: this rule is approximate"):
            test_rrule(f, X64)


def test_a_library_function_patched_restored_and_patched_again_is_seen_each_time(monkeypatch):
    """Watched module attributes are compared by identity and held by the key: a patch, its
    undo and another patch (whose function could reuse the first one's freed address) are
    three different states; swapping two attributes is a change too."""
    f = with_rrule("mysin", jnp.sin, lambda y_bar, x: (NoTangent(), y_bar * jnp.cos(x)))
    cos = jnp.cos
    for _ in range(3):
        test_rrule(f, X64)
        with monkeypatch.context() as patch:
            patch.setattr(jnp, "cos", lambda v: 1.01 * cos(v))
            with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
                test_rrule(f, X64)
    test_rrule(f, X64)
    monkeypatch.setattr(jnp, "cos", jnp.sin)
    monkeypatch.setattr(jnp, "sin", cos)  # swapped: the rule's jnp.cos is now sin
    with pytest.raises(AssertionError):
        test_rrule(f, X64)


def test_a_rule_reading_a_large_array_reuses_its_compilation_until_the_array_changes():
    """A large NumPy array a rule closes over is compiled into its program (the lowered
    module holds its values): the same values reuse the compilation, and after a change in
    place the program is another one, compiled anew, and the change is seen."""
    from rules.testing import _compiled

    big = np.ones(1 << 16)
    f = with_rrule("mysin", jnp.sin, lambda y_bar, x: (NoTangent(), big[: x.shape[0]] * y_bar * jnp.cos(x)))
    test_rrule(f, X64)
    before = dict(_compiled.stats)
    test_rrule(f, X64)
    assert _compiled.stats["reused"] > before["reused"] and _compiled.stats["compiled"] == before["compiled"]
    big[:] = 1.01
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(f, X64)


# ------------------------------------------------------------------------------------------
# Default strength and parity with ChainRulesTestUtils (issue 25)
# ------------------------------------------------------------------------------------------


def _one_entry_wrong(n, k, delta):
    """sin(x) * x with a pullback `delta` wrong (relative) in entry k only."""
    error = np.ones(n)
    error[k] += delta
    return with_rrule("sinx", lambda x: jnp.sin(x) * x,
                      lambda y_bar, x: (NoTangent(), jnp.asarray(error) * y_bar * (jnp.cos(x) * x + jnp.sin(x))))


def test_the_default_catches_a_rule_wrong_in_one_entry_of_two_hundred():
    """Exact mode reaches 256 elements and compares entry by entry: 1e-4 in one entry of 200
    is seen at its own size, not diluted by sqrt(200) (the 2-norm) or 200 (fast mode)."""
    x = jnp.linspace(0.1, 2.0, 200)
    assert test_rrule(_one_entry_wrong(200, 17, 0.0), x).mode == "exact"
    for delta in (1e-4, 1e-6):
        with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
            test_rrule(_one_entry_wrong(200, 17, delta), x)
    test_rrule(_one_entry_wrong(200, 17, 1e-6), x, mode="fast")  # what fast mode cannot see


def test_first_of_a_tuple_argument_gets_a_tuple_cotangent():
    """ChainRulesTestUtils' `test_rrule(first, (x, y))`, of a 4-tuple, and of a vector of tuples."""
    def first(t):
        return t[0]

    x, y = jnp.array([1.0, 2.0]), jnp.array([3.0])
    for args in [((x, y),), ((x, y, 2.0, jnp.ones(3)),), ([(x, y), (2 * x, y)],)]:
        assert test_rrule(first, *args).kind == "jax.vjp"
        assert test_frule(first, *args).kind == "jax.jvp"


def test_approx_fails_for_a_tuple_against_a_tangent_of_another_type():
    import collections

    Pair = collections.namedtuple("Pair", "a b")
    with pytest.raises(AssertionError, match="a Tangent of another type"):
        test_approx((1.0, 2.0), Tangent(Pair, 1.0, 2.0))
    with pytest.raises(AssertionError, match="a Tangent of another type"):
        test_approx(Tangent(Pair, 1.0, 2.0), (1.0, 2.0))
    test_approx(Pair(1.0, 2.0), Tangent(Pair, a=1.0, b=2.0))
    test_approx((1.0, 2.0), Tangent(tuple, 1.0, 2.0))


def test_a_method_on_a_custom_grid_checks_rules():
    """FiniteDifferences.jl's `FiniteDifferenceMethod([-2, 0, 5], 1)` as the testers' method."""
    from rules.testing import FDMethod

    m = FDMethod.from_grid([-2, 0, 5], 1)
    assert test_rrule(sin_rule(), X64, fdm=m).mode == "exact"
    test_frule(sin_frule(), X64, fdm=m)
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(sin_rule(1.001), X64, fdm=m)
