"""test_rrule / test_frule on JAX's own custom derivatives and plain JAX functions.

A `jax.custom_vjp`, a `jax.custom_jvp` or plain JAX code has no rule of ours: the testers
check JAX's own `jax.vjp` / `jax.jvp` of it (so its custom rule) with the same checks as a
rule: finite differences in float64, dtypes, under `jax.jit` and `jax.vmap`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
from rules.testing import test_frule, test_rrule, test_scalar, with_tangent

X = jnp.array([0.3, -1.2, 0.7])
Y = jnp.array([1.1, 0.4, -0.5])


def custom_vjp_sin_times(scale=1.0, cast=None, traced_scale=None):
    """`sin(x) * y` as a jax.custom_vjp whose bwd is `scale` times right for x (cast to `cast`;
    `traced_scale` instead when the bwd runs under a trace)."""

    @jax.custom_vjp
    def sin_times(x, y):
        return jnp.sin(x) * y

    def fwd(x, y):
        return sin_times(x, y), (x, y)

    def bwd(res, g):
        x, y = res
        s = traced_scale if traced_scale is not None and isinstance(g, jax.core.Tracer) else scale
        gx = s * g * jnp.cos(x) * y
        return (gx if cast is None else gx.astype(cast)), g * jnp.sin(x)

    sin_times.defvjp(fwd, bwd)
    return sin_times


def custom_jvp_softplus(scale=1.0):
    """softplus as a jax.custom_jvp whose tangent is `scale` times right."""

    @jax.custom_jvp
    def softplus(x):
        return jnp.logaddexp(x, 0.0)

    @softplus.defjvp
    def softplus_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return softplus(x), scale * jax.nn.sigmoid(x) * t

    return softplus


def test_a_right_custom_vjp_passes_with_every_check():
    report = test_rrule(custom_vjp_sin_times(), X, Y)
    assert report.kind == "jax.vjp" and report.modes == "rev"
    assert {"finite differences (exact)", "jax.jit(jax.vjp)", "jax.vmap", "dtypes"} <= set(report.checks)
    assert any("forward mode not checked: f calls a jax.custom_vjp" in c for c in report.checks)


@pytest.mark.parametrize("error", [1e-2, 1e-7])
def test_a_wrong_custom_vjp_is_caught_and_the_argument_named(error):
    with pytest.raises(AssertionError, match=r"(?s)cotangent does not match finite differences.*argument 1 \(x\)"
                       r".*expected.*got"):
        test_rrule(custom_vjp_sin_times(1 + error), X, Y)


def test_a_float32_custom_vjp_is_checked_against_float64_differences():
    x32, y32 = X.astype(jnp.float32), Y.astype(jnp.float32)
    assert test_rrule(custom_vjp_sin_times(), x32, y32).kind == "jax.vjp"
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(custom_vjp_sin_times(1.001), x32, y32)


def test_a_custom_vjp_returning_float64_for_float32_inputs_is_caught():
    """JAX does not check a bwd's dtypes; the tester does, and says where to cast."""
    x32, y32 = X.astype(jnp.float32), Y.astype(jnp.float32)
    with pytest.raises(AssertionError, match=r"(?s)shape and dtype.*float32.*float64.*astype"):
        test_rrule(custom_vjp_sin_times(cast=jnp.float64), x32, y32)


def test_a_custom_vjp_wrong_only_when_traced_is_reported_as_that():
    with pytest.raises(AssertionError, match="differs under jax.jit from its eager value"):
        test_rrule(custom_vjp_sin_times(traced_scale=1.01), X, Y)
    with pytest.raises(AssertionError, match="jax.vmap: batched differs from looped"):  # vmap traces it too
        test_rrule(custom_vjp_sin_times(traced_scale=1.01), X, Y, check_jit=False)
    test_rrule(custom_vjp_sin_times(traced_scale=1.01), X, Y, check_jit=False, check_vmap=False)  # eagerly right


def test_a_custom_jvp_is_checked_in_forward_and_reverse_mode():
    report = test_frule(custom_jvp_softplus(), X)
    assert report.kind == "jax.jvp"
    assert {"finite differences", "jax.jit(jax.jvp)", "jax.vmap"} <= set(report.checks)
    reverse = test_rrule(custom_jvp_softplus(), X)  # JAX transposes the custom JVP
    assert reverse.modes == "fwd+rev" and "jax.jvp (transposed pullback)" in reverse.checks


@pytest.mark.parametrize("error", [1e-2, 1e-7])
def test_a_wrong_custom_jvp_is_caught(error):
    with pytest.raises(AssertionError, match="tangent does not match finite differences"):
        test_frule(custom_jvp_softplus(1 + error), X)
    with pytest.raises(AssertionError, match="cotangent does not match finite differences"):
        test_rrule(custom_jvp_softplus(1 + error), X)


def test_an_argument_of_a_jax_function_marked_not_differentiated_is_held_fixed():
    """JAX's derivative gives every float argument a cotangent; one marked
    `with_tangent(y, NoTangent())` is not perturbed and its cotangent not checked."""
    fixed = with_tangent(Y, rules.NoTangent())
    assert "finite differences (exact)" in test_rrule(custom_vjp_sin_times(), X, fixed).checks
    assert "finite differences (exact)" in test_rrule(lambda x, y: jnp.sin(x) * y, X, fixed).checks
    with pytest.raises(AssertionError, match=r"(?s)cotangent does not match finite differences.*argument 1"):
        test_rrule(custom_vjp_sin_times(1.01), X, fixed)


def test_a_custom_rule_that_jax_rejects_fails_the_check_naming_the_function():
    """JAX checks a custom_vjp's cotangent shapes and a custom_jvp's tangent dtypes itself;
    its error is the check's failure, not an exception escaping the tester."""
    f = jax.custom_vjp(jnp.sin)
    f.defvjp(lambda x: (jnp.sin(x), x), lambda x, y_bar: ((y_bar * jnp.cos(x))[None],))
    with pytest.raises(AssertionError, match=r"(?s)test_rrule\(.*sin\): JAX's own jax.vjp of f raised.*ValueError"):
        test_rrule(f, X)
    g = custom_jvp_softplus()
    g.defjvp(lambda p, t: (g(p[0]), (jax.nn.sigmoid(p[0]) * t[0]).astype(jnp.float64)))
    with pytest.raises(AssertionError, match=r"(?s)JAX's own jax.jvp of f raised.*TypeError"):
        test_frule(g, X.astype(jnp.float32))


def test_a_plain_jax_function_is_checked_like_check_grads_but_stronger():
    def f(x, y):
        return jnp.tanh(x) * y ** 2

    assert test_rrule(f, X, Y).modes == "fwd+rev"
    assert test_frule(f, X, Y).kind == "jax.jvp"


def test_test_frule_of_a_custom_vjp_says_jax_has_no_forward_mode_for_it():
    with pytest.raises(AssertionError, match=r"(?s)jax.custom_vjp.*no forward mode.*test_rrule"):
        test_frule(custom_vjp_sin_times(), X, Y)


def test_a_function_calling_a_custom_vjp_inside_is_checked_in_reverse_mode_only():
    inner = custom_vjp_sin_times()

    def outer(x, y):
        return jnp.exp(inner(x, y)) + x

    report = test_rrule(outer, X, Y)
    assert report.modes == "rev"
    with pytest.raises(AssertionError, match="no forward mode"):
        test_frule(outer, X, Y)


def _complex_custom_jvp(error=0.0):
    """z exp(z) as a jax.custom_jvp, its tangent (1 + error) times right."""
    f = jax.custom_jvp(lambda z: z * jnp.exp(z))
    f.defjvp(lambda p, t: (f(p[0]), (1 + error) * jnp.exp(p[0]) * (1 + p[0]) * t[0]))
    return f


def _complex_custom_vjp(error=0.0):
    """z sin(z) as a jax.custom_vjp, its cotangent (1 + error) times right (JAX's convention:
    g f'(z) for a holomorphic f)."""
    f = jax.custom_vjp(lambda z: z * jnp.sin(z))
    f.defvjp(lambda z: (f(z), z), lambda z, g: ((1 + error) * g * (jnp.sin(z) + z * jnp.cos(z)),))
    return f


@pytest.mark.parametrize("z", [0.4, 0.4 - 0.7j], ids=["real", "complex"])
def test_test_scalar_checks_jax_functions_through_their_own_derivatives(z):
    assert [r.kind for r in test_scalar(_complex_custom_jvp(), z)] == ["jax.jvp", "jax.vjp"] * (2 if isinstance(z, complex) else 1)
    # a custom_vjp has no forward mode in JAX: reverse mode only
    assert {r.kind for r in test_scalar(_complex_custom_vjp(), z)} == {"jax.vjp"}
    for wrong in (_complex_custom_jvp(0.01), _complex_custom_vjp(0.01)):
        with pytest.raises(AssertionError, match="does not match finite differences"):
            test_scalar(wrong, z)
    with pytest.raises(AssertionError, match="no rule applies"):  # a primitive of ours still needs its rule
        test_scalar(rules.primitive(lambda z: 2 * z), z)


def test_a_primitive_without_an_rrule_still_asks_for_one():
    """A `rules.primitive` is ours: a missing rrule is the user's to register, not JAX's."""
    prim = rules.primitive(lambda x: jnp.sin(x))
    with pytest.raises(AssertionError, match="no rrule applies"):
        test_rrule(prim, X)


def test_the_custom_vjp_detection_sees_through_nested_jaxprs():
    """Canary: a custom_vjp inside jit and scan is found by its primitive's name on this JAX."""
    from rules.testing._testers import _calls_custom_vjp

    inner = custom_vjp_sin_times()

    def nested(x):
        return jax.lax.scan(lambda c, v: (c + jax.jit(inner)(v, v), None), 0.0, x)[0]

    assert _calls_custom_vjp(jax.make_jaxpr(nested)(X).jaxpr)
    assert not _calls_custom_vjp(jax.make_jaxpr(custom_jvp_softplus())(X).jaxpr)
    assert not _calls_custom_vjp(jax.make_jaxpr(lambda v: jnp.sin(v) * 2)(X).jaxpr)

    @jax.custom_jvp  # a custom_vjp in its body: its own rule gives JAX forward mode
    def outer(x):
        return inner(x, x)

    outer.defjvp(lambda p, t: (outer(*p), (jnp.cos(p[0]) * p[0] + jnp.sin(p[0])) * t[0]))
    assert not _calls_custom_vjp(jax.make_jaxpr(outer)(X).jaxpr)
    assert test_frule(outer, X).kind == "jax.jvp"
    assert test_rrule(outer, X).modes == "fwd+rev"
    np.testing.assert_allclose(jax.grad(nested)(X), np.cos(X) * X + np.sin(X), rtol=1e-12)


# ------------------------------------------------------------------------------------------
# No false alarm on real code: domains, non-finite inputs, joints, solvers' tolerances
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, f, args", [
    ("logit near 0 and 1", jax.scipy.special.logit, (jnp.array([1e-6, 0.5, 1 - 1e-6]),)),
    ("sqrt near 0", jnp.sqrt, (jnp.array([1e-9, 2.0]),)),
    ("log1p near -1", jnp.log1p, (jnp.array([-1 + 1e-7, 2.0]),)),
])
def test_near_a_boundary_of_the_domain_the_differences_stay_inside_it(name, f, args):
    """A central stencil there would step outside the domain (NaN); the step is shortened and
    then one-sided stencils are used, so JAX's right derivative passes and a wrong one fails."""
    test_rrule(f, *args)
    test_frule(f, *args)

    @jax.custom_jvp
    def off(x):
        return f(x)

    off.defjvp(lambda p, t: (f(p[0]), 1.001 * jax.jvp(f, p, t)[1]))
    with pytest.raises(AssertionError, match="does not match finite differences"):
        test_rrule(off, *args)


def test_a_non_finite_input_is_held_constant():
    """logaddexp(1, -inf): the -inf entry cannot be perturbed (-inf + h is -inf); its
    derivative is 0 for the finite differences, and the other entries are checked."""
    a, b = jnp.array([1.0, 2.0]), jnp.array([-jnp.inf, 0.5])
    test_rrule(jnp.logaddexp, a, b)
    test_frule(jnp.logaddexp, a, b)
    from rules.testing import central_fdm, fd_jacobian, fd_vjp

    m = central_fdm(5, 1)
    _, jac_b = fd_jacobian(m, jnp.logaddexp, a, b)
    np.testing.assert_allclose(jac_b, np.diag([0.0, 1 / (1 + np.exp(1.5))]), atol=1e-10)
    _, bar_b = fd_vjp(m, jnp.logaddexp, jnp.ones(2), (a, b))
    assert bar_b[0] == 0.0 and np.isfinite(bar_b).all()


def test_public_finite_differences_stay_in_the_domain():
    from rules.testing import central_fdm, fd_jacobian, fd_jvp, fd_vjp

    m, x = central_fdm(5, 1), jnp.array([1e-6, 0.5])
    exact = 1 / (x * (1 - x))
    np.testing.assert_allclose(fd_vjp(m, jax.scipy.special.logit, jnp.ones(2), (x,))[0], exact, rtol=1e-9)
    np.testing.assert_allclose(np.diag(fd_jacobian(m, jax.scipy.special.logit, x)[0]), exact, rtol=1e-9)
    y_dot = fd_jvp(m, jax.scipy.special.logit, (x,), (jnp.array([1.0, 0.0]),))
    np.testing.assert_allclose(y_dot, [exact[0], 0.0], rtol=1e-8, atol=1e-6)


def _huber(x, delta=1.0):
    a = jnp.abs(x)
    return jnp.where(a <= delta, 0.5 * x**2, delta * (a - 0.5 * delta))


def test_at_a_c1_joint_the_rule_is_checked_against_one_sided_differences():
    """Huber's loss at |x| = delta: f' is continuous, f'' is not, and a central stencil is off
    by ~1e-5; the forward and backward ones are exact on their sides. A wrong rule matches
    none of them."""
    x = jnp.array([1.0, 0.3, -1.0])
    report = test_rrule(_huber, x)
    assert any("one-sided finite differences at 2 entries" in c for c in report.checks)
    assert any("one-sided" in c for c in test_frule(_huber, x).checks)

    @jax.custom_jvp
    def wrong(x):
        return _huber(x)

    wrong.defjvp(lambda p, t: (_huber(p[0]), jnp.clip(p[0], -1.0, 1.0) * t[0] * 1.001))
    with pytest.raises(AssertionError, match="does not match finite differences"):
        test_rrule(wrong, x)


def test_the_report_counts_one_sided_entries_only_where_the_central_stencil_missed():
    """Where the central estimate already matches the rule, a one-sided one nearer by rounding
    is not used or counted: 1/x at 300 points, one of them at 1e-6 (short spans there), once
    reported 44 entries "not smooth"; |x| x + |x| with one kink, 2."""
    x = jnp.asarray(np.random.default_rng(0).uniform(0.5, 2.0, 300)).at[7].set(1e-6)
    sided = [c for c in test_frule(lambda v: 1 / v, x).checks if c.startswith("one-sided")]
    assert sided == ["one-sided finite differences at 1 entries (f has a kink or changes fast there)"]
    y = jnp.asarray(np.random.default_rng(1).uniform(0.5, 2.0, 40)).at[3].set(0.0)
    assert "one-sided finite differences at 1 entries (f has a kink or changes fast there)" in test_rrule(
        lambda v: jnp.abs(v) * v + jnp.abs(v), y).checks


def _newton_free_root(tol, scale=1.0):
    """sqrt(a) by a linearly converging iteration stopped at a relative tolerance, with the
    implicit derivative 1 / (2 x) as its rule (times `scale`)."""

    @jax.custom_vjp
    def root(a):
        def body(c):
            x, _ = c
            new = x - 0.1 * (x * x - a)
            return new, jnp.max(jnp.abs(new - x) / new)

        return jax.lax.while_loop(lambda c: c[1] > tol, body, (jnp.ones_like(a) * 1.5, jnp.inf))[0]

    root.defvjp(lambda a: (root(a), root(a)), lambda x, g: (scale * g / (2 * x),))
    return root


def test_a_solver_accurate_to_its_tolerance_is_checked_with_a_tolerance_to_match():
    """f itself is only as accurate as the solver's tolerance, so differences of it are too:
    `rtol` near that tolerance (and `fdm` with `factor` raised, for f's noise) fits the check
    to it, and a 1% wrong rule still fails."""
    from rules.testing import central_fdm

    a = jnp.array([0.7, 2.0, 5.0])
    with pytest.raises(AssertionError, match="does not match finite differences"):
        test_rrule(_newton_free_root(1e-6), a)  # the default tolerance expects f exact to ~1e-15
    fitted = dict(rtol=1e-4, fdm=central_fdm(5, 1, factor=1e9))
    test_rrule(_newton_free_root(1e-6), a, **fitted)
    with pytest.raises(AssertionError, match="does not match finite differences"):
        test_rrule(_newton_free_root(1e-6, scale=1.01), a, **fitted)


def test_the_cotangent_of_a_held_entry_is_not_compared():
    """What a rule gives for an infinite input (NaN here) cannot be checked by differences."""

    @jax.custom_vjp
    def lae(a, b):
        return jnp.logaddexp(a, b)

    def bwd(res, g):
        a, b = res
        ga, gb = g * jnp.exp(a - lae(a, b)), g * jnp.exp(b - lae(a, b))
        return ga, jnp.where(jnp.isinf(b), jnp.nan, gb)

    lae.defvjp(lambda a, b: (lae(a, b), (a, b)), bwd)
    test_rrule(lae, jnp.array([1.0, 2.0]), jnp.array([-jnp.inf, 0.5]))


# Where f changes fast on the scale of the step its step rule chooses (a pole near x, inputs
# of a sort nearly tied), the default finite differences are wrong; they are tried again at
# ever shorter spans, an entry accepted where the rule matches two spans in a row.
def _sort_rule(wrong_at=None):
    @jax.custom_vjp
    def sort(x):
        return jnp.sort(x)

    def bwd(order, y_bar):
        x_bar = jnp.zeros_like(y_bar).at[order].set(y_bar)
        return (x_bar if wrong_at is None else x_bar.at[wrong_at].multiply(1 + 1e-7),)

    sort.defvjp(lambda x: (jnp.sort(x), jnp.argsort(x)), bwd)
    return sort


_NEAR_TIES = jnp.asarray(np.random.default_rng(3).standard_normal(40)).at[7:10].set(0.25 + 3e-7 * jnp.arange(3.0))


def test_a_sort_whose_inputs_nearly_tie_is_checked_between_the_ties():
    report = test_rrule(_sort_rule(), _NEAR_TIES, check_vmap=False)
    assert any("shorter spans" in check for check in report.checks), report.checks
    with pytest.raises(AssertionError, match=r"argument 1 \(x\)"):  # wrong by 1e-7 at the tied entry
        test_rrule(_sort_rule(wrong_at=8), _NEAR_TIES, check_vmap=False)


@pytest.mark.parametrize("f, x", [(lambda x: 1 / x, 1e-6), (jnp.cbrt, 1e-6), (jnp.tan, 1.5707)],
                         ids=["reciprocal", "cbrt", "tan"])
def test_where_f_changes_fast_shorter_spans_check_the_rule(f, x):
    x = jnp.array([x, 0.5])
    report = test_rrule(f, x, check_vmap=False)
    assert any("shorter spans" in check for check in report.checks), report.checks
    off = jax.custom_vjp(f)
    off.defvjp(lambda x: (f(x), x), lambda x, y_bar: (jax.vjp(f, x)[1](y_bar)[0] * (1 + 1e-7),))
    with pytest.raises(AssertionError, match="does not match finite differences"):
        test_rrule(off, x, check_vmap=False)


def test_shorter_spans_stop_where_the_inputs_no_longer_resolve_them():
    from rules.testing._finite_differences import _shorter_spans
    from rules.testing import central_fdm

    assert [m.max_range for m in _shorter_spans(central_fdm(5, 1), np.array([1.0, 2.0]))][:2] == [1e-2, 1e-4]
    assert _shorter_spans(central_fdm(5, 1), np.array([1e10, 1.0])) == []  # 2^16 spacings of 1e10 > 1e-2
    assert [m.max_range for m in _shorter_spans(central_fdm(5, 1, max_range=1e-5), np.ones(2))][0] == 1e-6


def test_shorter_spans_accept_an_entry_only_where_two_in_a_row_agree():
    from rules.testing._testers import _two_in_a_row

    got, expected = (np.array([1.0, 2.0, 3.0]),), (np.array([1.0, 2.5, 3.5]),)
    spans = [(np.array([0.0, 2.0, 9.0]),), (np.array([0.0, 2.0, 3.0]),), (np.array([5.0, 7.0, 3.0]),)]
    out, count = _two_in_a_row(got, expected, iter(spans), 1e-8, 1e-10)
    # entry 1 agrees at spans 0 and 1; entry 2 only at 1 and 2, entry 0 already matched
    np.testing.assert_array_equal(out[0], [1.0, 2.0, 3.0])
    assert count == 2
    out, count = _two_in_a_row(got, expected, iter(spans[1:2] + spans[:1]), 1e-8, 1e-10)
    np.testing.assert_array_equal(out[0], [1.0, 2.0, 3.5])  # entry 2 agrees with one span only
    assert count == 1
    made = []
    _two_in_a_row(got, got, (made.append(s) or s for s in spans), 1e-8, 1e-10)
    assert made == []  # nothing left to match: no estimate is made


@pytest.mark.parametrize("f, x", [(lambda x: 1 / x, 1e-6), (jnp.cbrt, 1e-6), (jnp.tan, 1.5707)],
                         ids=["reciprocal", "cbrt", "tan"])
def test_where_f_changes_fast_fast_mode_and_test_frule_retry_at_shorter_spans(f, x):
    # above the exact-mode limit: fast mode's probes, and test_frule's tangent along x_dot
    x = jnp.asarray(np.random.default_rng(0).uniform(0.5, 1.0, 300)).at[3].set(x)
    test_rrule(f, x, check_vmap=False, mode="fast")
    test_frule(f, x, check_vmap=False)
    off_vjp, off_jvp = jax.custom_vjp(f), jax.custom_jvp(f)
    off_vjp.defvjp(lambda x: (f(x), x), lambda x, y_bar: (jax.vjp(f, x)[1](y_bar)[0] * (1 + 1e-7),))
    off_jvp.defjvp(lambda p, t: (f(p[0]), jax.jvp(f, p, t)[1] * (1 + 1e-7)))
    with pytest.raises(AssertionError, match="does not match finite differences"):
        test_rrule(off_vjp, x, check_vmap=False, mode="fast")
    with pytest.raises(AssertionError, match="does not match finite differences"):
        test_frule(off_jvp, x, check_vmap=False)


@pytest.mark.parametrize("f, z", [(lambda z: 1 / z, 1e-6 + 1e-6j), (jnp.tan, 1.5707 + 0j)], ids=["reciprocal", "tan"])
def test_where_f_changes_fast_test_scalar_retries_its_partials_at_shorter_spans(f, z):
    test_scalar(f, z)
    off = jax.custom_jvp(f)
    off.defjvp(lambda p, t: (f(p[0]), jax.jvp(f, p, t)[1] * (1 + 1e-7)))
    with pytest.raises(AssertionError, match="does not match finite differences"):
        test_scalar(off, z)


def test_a_custom_jvp_giving_python_numbers_for_a_python_complex_is_checked():
    # JAX's jax.vjp of it returns a Python complex; its cotangent seed is made in that dtype
    f = jax.custom_jvp(lambda z: 1 / z)
    f.defjvp(lambda p, t: (1 / p[0], -t[0] / p[0] ** 2))
    assert {r.kind for r in test_scalar(f, 0.5 + 0.25j)} == {"jax.jvp", "jax.vjp"}
    wrong = jax.custom_jvp(lambda z: 1 / z)
    wrong.defjvp(lambda p, t: (1 / p[0], -1.01 * t[0] / p[0] ** 2))
    with pytest.raises(AssertionError, match="does not match finite differences"):
        test_scalar(wrong, 0.5 + 0.25j)
