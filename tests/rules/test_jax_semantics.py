"""A primitive behaves as the same function written with `jax.custom_vjp` / `jax.custom_jvp`
would, where JAX defines the behaviour (issue 22): each test computes both and compares."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
from rules import NoTangent, _dual
from rules._jax_compat import VALUE_DEPENDENT, concrete_value


# ----- a function that branches on its argument's value: eager transformations compute it -------
def _branchy(x):
    return x * 2 if x > 0 else x * 3


def _slope(x):
    return 2.0 if x > 0 else 3.0


def _jax_branchy():
    f = jax.custom_vjp(_branchy)
    f.defvjp(lambda x: (_branchy(x), x), lambda x, g: (g * _slope(x),))
    return f


def _jax_branchy_jvp():
    f = jax.custom_jvp(_branchy)
    f.defjvp(lambda primals, tangents: (_branchy(primals[0]), tangents[0] * _slope(primals[0])))
    return f


def _rules_branchy(with_frule):
    f = rules.primitive(_branchy)

    @f.rrule
    def branchy_rrule(x):
        return _branchy(x), lambda g: (NoTangent(), g * _slope(x))

    if with_frule:

        @f.frule
        def branchy_frule(tangents, x):
            return _branchy(x), tangents[1] * _slope(x)

    return f


@pytest.mark.parametrize("with_frule", [False, True], ids=["rrule", "rrule+frule"])
@pytest.mark.parametrize("x", [1.5, -0.5])
def test_eager_transformations_of_a_value_branching_function_compute_it_as_custom_vjp_does(with_frule, x):
    ours, theirs = _rules_branchy(with_frule), _jax_branchy()
    for transform in (jax.value_and_grad, jax.grad):
        np.testing.assert_array_equal(np.array(transform(ours)(x)), np.array(transform(theirs)(x)))
    # forward mode (custom_vjp has none: custom_jvp is JAX's function with one)
    got, want = jax.jvp(ours, (x,), (1.0,)), jax.jvp(_jax_branchy_jvp(), (x,), (1.0,))
    assert [float(v) for v in got] == [float(v) for v in want] == [_branchy(x), _slope(x)]
    # both call it twice, with the values the branch needs (a new value takes the other branch)
    assert float(jax.grad(ours)(-x)) == float(jax.grad(theirs)(-x)) == _slope(-x)


def test_under_jit_a_value_branching_function_fails_as_in_jax():
    ours, theirs = _rules_branchy(False), _jax_branchy()
    with pytest.raises(jax.errors.TracerBoolConversionError):
        jax.jit(jax.grad(theirs))(1.5)
    with pytest.raises(jax.errors.TracerBoolConversionError):
        jax.jit(jax.grad(ours))(1.5)


def test_concrete_value_probe_sees_through_eager_tracers_only():
    seen = []

    def f(x):
        seen.append(concrete_value(x))
        return x * 2

    jax.jvp(f, (1.5,), (1.0,))
    jax.grad(f)(2.5)
    jax.jit(f)(3.5)
    assert [None if v is None else float(v) for v in seen] == [1.5, 2.5, None]
    assert concrete_value(4.0) == 4.0
    assert issubclass(jax.errors.TracerBoolConversionError, VALUE_DEPENDENT)


# ----- key arrays: non-differentiable arguments, as in jax.custom_vjp -------------------------
def _noisy(x, key):
    return x + jax.random.normal(key, x.shape)


@pytest.fixture(scope="module")
def noisy_pair():
    ours = rules.primitive(_noisy)

    @ours.rrule
    def noisy_rrule(x, key):
        return _noisy(x, key), lambda g: (NoTangent(), g, NoTangent())

    theirs = jax.custom_vjp(_noisy)
    theirs.defvjp(lambda x, key: (_noisy(x, key), None), lambda _, g: (g, None))
    return ours, theirs


@pytest.mark.parametrize("key_of", [jax.random.key, jax.random.PRNGKey], ids=["typed key", "raw uint32 key"])
def test_a_key_argument_is_not_differentiated(noisy_pair, key_of):
    ours, theirs = noisy_pair
    key, x = key_of(0), jnp.array([0.5, -1.0])
    for wrap in (lambda f: f, jax.jit):
        got = wrap(jax.grad(lambda x: jnp.sum(jnp.sin(ours(x, key)))))(x)
        want = wrap(jax.grad(lambda x: jnp.sum(jnp.sin(theirs(x, key)))))(x)
        np.testing.assert_allclose(got, want, rtol=1e-12)
    y, y_dot = jax.jvp(lambda x: ours(x, key), (x,), (jnp.ones(2),))
    np.testing.assert_allclose(y, _noisy(x, key), rtol=1e-12)
    np.testing.assert_allclose(y_dot, jnp.ones(2))
    np.testing.assert_allclose(jax.vmap(lambda x: ours(x, key))(jnp.stack([x, x])), jnp.stack([_noisy(x, key)] * 2))


# ----- jaxprs name the primitive --------------------------------------------------------------
def test_an_frule_only_primitive_is_named_in_jaxprs():
    @rules.primitive
    def cube(x):
        return x**3

    @cube.frule
    def cube_frule(tangents, x):
        return cube(x), 3 * x**2 * tangents[1]

    text = str(jax.make_jaxpr(cube)(1.0))
    assert "name=cube" in text and "name=primal" not in text
    assert float(jax.grad(cube)(2.0)) == 12.0


# ----- a zero tangent stays symbolic from one rule to the next --------------------------------
def test_a_zero_tangent_from_an_frule_reaches_the_next_frule_symbolic():
    seen = []

    stop = rules.primitive(lambda x: x * 1.0)

    @stop.frule
    def stop_frule(tangents, x):
        return x * 1.0, rules.ZeroTangent()  # as ignore_derivatives

    watch = rules.primitive(lambda x: 2 * x)

    @watch.frule
    def watch_frule(tangents, x):
        seen.append(type(tangents[1]).__name__)
        return 2 * x, 2 * tangents[1]

    # JAX's own: a custom_jvp with symbolic zeros receives the SymbolicZero the one before returned
    jax_seen = []
    jax_stop = jax.custom_jvp(lambda x: x * 1.0)
    jax_stop.defjvp(lambda p, t: (p[0] * 1.0, jax.custom_derivatives.SymbolicZero(jax.typeof(p[0]).to_tangent_aval())),
                    symbolic_zeros=True)
    jax_watch = jax.custom_jvp(lambda x: 2 * x)

    def jax_watch_jvp(p, t):
        jax_seen.append(type(t[0]).__name__)
        return 2 * p[0], 2 * t[0] if not isinstance(t[0], jax.custom_derivatives.SymbolicZero) else t[0]

    jax_watch.defjvp(jax_watch_jvp, symbolic_zeros=True)
    for wrap in (lambda f: f, jax.jit):
        ours = wrap(lambda x: jax.jvp(lambda x: watch(stop(x)), (x,), (1.0,)))(1.5)
        theirs = wrap(lambda x: jax.jvp(lambda x: jax_watch(jax_stop(x)), (x,), (1.0,)))(1.5)
        assert [float(v) for v in ours] == [float(v) for v in theirs] == [3.0, 0.0]
    assert jax_seen == [] and seen == [], (jax_seen, seen)


# ----- an rrule that closes over a vmap tracer --------------------------------------------------
def _scaled_by(a, name):
    """sin(x) * a with a closed over: as a primitive and as JAX's custom_vjp."""
    p = rules.primitive(lambda x: jnp.sin(x) * a, name=name)

    @p.rrule
    def scaled_rrule(x):
        return jnp.sin(x) * a, lambda g: (NoTangent(), g * jnp.cos(x) * a)

    cv = jax.custom_vjp(lambda x: jnp.sin(x) * a)
    cv.defvjp(lambda x: (jnp.sin(x) * a, x), lambda x, g: (g * jnp.cos(x) * a,))
    return p, cv


@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_a_rule_closing_over_a_vmap_tracer_differentiated_inside_the_vmap_computes_as_custom_vjp(wrap):
    def per(which):
        return lambda a: jax.grad(_scaled_by(a, "inner")[which])(0.5)

    ours, theirs = wrap(jax.vmap(per(0)))(jnp.arange(3.0)), wrap(jax.vmap(per(1)))(jnp.arange(3.0))
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    np.testing.assert_allclose(ours, np.cos(0.5) * np.arange(3.0), rtol=1e-6)


@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_a_rule_closing_over_a_vmap_tracer_differentiated_outside_raises_naming_the_primitive(wrap):
    def loss(which):
        return lambda x: jnp.sum(jax.vmap(lambda a: _scaled_by(a, "scaled_by_a")[which](x))(jnp.arange(3.0)))

    with pytest.raises(jax.errors.UnexpectedTracerError):  # JAX's custom_vjp cannot either
        wrap(jax.grad(loss(1)))(0.5)
    if _dual.ENABLED:  # the rule runs beneath the vmap, as custom_vjp's fwd does
        with pytest.raises(rules.TracerClosureError, match=r"rrule of `scaled_by_a`[\s\S]*fix: .*as an argument") as err:
            wrap(jax.grad(loss(0)))(0.5)
        assert isinstance(err.value, jax.errors.UnexpectedTracerError)
    else:  # the custom_vjp/custom_jvp lowering computes it
        np.testing.assert_allclose(wrap(jax.grad(loss(0)))(0.5), 3 * np.cos(0.5), rtol=1e-6)
    # the fix the message names: the value as an argument
    p = rules.primitive(lambda x, a: jnp.sin(x) * a, name="scaled")

    @p.rrule
    def scaled_rrule(x, a):
        return jnp.sin(x) * a, lambda g: (NoTangent(), g * jnp.cos(x) * a, g * jnp.sin(x))

    fixed = jax.grad(lambda x: jnp.sum(jax.vmap(lambda a: p(x, a))(jnp.arange(3.0))))(0.5)
    np.testing.assert_allclose(fixed, 3 * np.cos(0.5), rtol=1e-6)


# ----- a pullback that rejects a zero pattern that never occurs ---------------------------------
def _first_only_pair():
    """(sin x, cos x) whose derivative is implemented for the first output only: the pullback
    raises if the second gets a cotangent; as a primitive and as JAX's custom_vjp."""
    p = rules.primitive(lambda x: (jnp.sin(x), jnp.cos(x)), name="first_only")

    @p.rrule
    def first_only_rrule(x):
        def first_only_pullback(y_bar):
            if not isinstance(y_bar[1], rules.AbstractZero):
                raise NotImplementedError("first_only: d/dx of the second output")
            return NoTangent(), y_bar[0] * jnp.cos(x)

        return (jnp.sin(x), jnp.cos(x)), first_only_pullback

    cv = jax.custom_vjp(lambda x: (jnp.sin(x), jnp.cos(x)))

    def cv_bwd(x, g):
        if not isinstance(g[1], jax.custom_derivatives.SymbolicZero):
            raise NotImplementedError("first_only: d/dx of the second output")
        return (g[0] * jnp.cos(x),)

    cv.defvjp(lambda x: ((jnp.sin(x.value), jnp.cos(x.value)), x.value), cv_bwd, symbolic_zeros=True)  # x: CustomVJPPrimal
    return p, cv


@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_a_pullback_rejecting_a_pattern_that_does_not_occur_works_as_custom_vjp(wrap):
    ours, theirs = _first_only_pair()
    for f in (ours, theirs):
        np.testing.assert_allclose(wrap(jax.grad(lambda x: f(x)[0]))(0.7), np.cos(0.7), rtol=1e-6)
        np.testing.assert_allclose(wrap(jax.vmap(jax.grad(lambda x: f(x)[0])))(jnp.array([0.7, 0.2])),
                                   np.cos([0.7, 0.2]), rtol=1e-6)
        with pytest.raises(NotImplementedError, match="second output"):  # the pattern that does occur
            wrap(jax.grad(lambda x: f(x)[1]))(0.7)


# ----- the pullback runs once, with the zero pattern JAX hands over -----------------------------
def _three_output_pair(seen_ours, seen_theirs):
    """(sin x, cos x, x^2), whose pullback / bwd records which cotangents are zero; as a
    primitive and as JAX's custom_vjp with symbolic zeros."""
    p = rules.primitive(lambda x: (jnp.sin(x), jnp.cos(x), x * x), name="three")

    @p.rrule
    def three_rrule(x):
        def three_pullback(y_bar):
            seen_ours.append(tuple(isinstance(g, rules.AbstractZero) for g in y_bar))
            x_bar = rules.ZeroTangent()
            for g, d in zip(y_bar, (jnp.cos(x), -jnp.sin(x), 2 * x)):
                if not isinstance(g, rules.AbstractZero):
                    x_bar = x_bar + g * d
            return NoTangent(), x_bar

        return (jnp.sin(x), jnp.cos(x), x * x), three_pullback

    cv = jax.custom_vjp(lambda x: (jnp.sin(x), jnp.cos(x), x * x))

    def cv_bwd(x, g):
        seen_theirs.append(tuple(isinstance(gi, jax.custom_derivatives.SymbolicZero) for gi in g))
        parts = [gi * d for gi, d in zip(g, (jnp.cos(x), -jnp.sin(x), 2 * x))
                 if not isinstance(gi, jax.custom_derivatives.SymbolicZero)]
        return (sum(parts[1:], parts[0]),)

    cv.defvjp(lambda x: ((jnp.sin(x.value), jnp.cos(x.value), x.value * x.value), x.value), cv_bwd, symbolic_zeros=True)
    return p, cv


def _total(outputs, used):
    return sum(outputs[i] for i in used)


_TRANSFORMS = {
    "eager": lambda g: g,
    "jit": jax.jit,
    "vmap": lambda g: jax.vmap(g),
    "jit(vmap)": lambda g: jax.jit(jax.vmap(g)),
}


@pytest.mark.parametrize("used", [(0,), (1, 2), (0, 1, 2)], ids=["one", "two", "all"])
@pytest.mark.parametrize("transform", list(_TRANSFORMS))
def test_a_pullback_of_three_outputs_runs_once_with_the_pattern_that_occurs(transform, used):
    seen_ours, seen_theirs = [], []
    ours, theirs = _three_output_pair(seen_ours, seen_theirs)
    x = jnp.array([0.3, 0.9]) if "vmap" in transform else 0.3
    grads = [
        _TRANSFORMS[transform](jax.grad(lambda x, f=f: _total(f(x), used)))(x) for f in (ours, theirs)
    ]
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6)
    pattern = tuple(i not in used for i in range(3))
    assert seen_theirs == [pattern]  # JAX calls bwd once, with the real symbolic zeros
    assert seen_ours == seen_theirs


def _scanned(f, used):
    def step(c, _):
        return c + _total(f(c), used) * 0.1, None

    return lambda x: jax.lax.scan(step, x, None, length=3)[0]


_OTHER_TRACES = {  # the backward pass in another trace than the forward pass: the rrule runs again
    "lax.scan": lambda f, used, x: jax.grad(_scanned(f, used))(x),
    "jit(vjp), called after": lambda f, used, x: jax.jit(lambda x: jax.vjp(lambda x: _total(f(x), used), x))(x)[1](1.0)[0],
    "checkpoint": lambda f, used, x: jax.grad(jax.checkpoint(lambda x: _total(f(x), used)))(x),
}


@pytest.mark.parametrize("used", [(0,), (1, 2)], ids=["one", "two"])
@pytest.mark.parametrize("where", list(_OTHER_TRACES))
def test_a_pullback_of_three_outputs_in_another_trace_runs_with_the_pattern_that_occurs(where, used):
    seen_ours, seen_theirs = [], []
    ours, theirs = _three_output_pair(seen_ours, seen_theirs)
    np.testing.assert_allclose(_OTHER_TRACES[where](ours, used, 0.3), _OTHER_TRACES[where](theirs, used, 0.3), rtol=1e-6)
    pattern = tuple(i not in used for i in range(3))
    assert seen_theirs and set(seen_theirs) == {pattern}
    assert seen_ours == seen_theirs


# ----- every transformation of a several-output rrule computes the function's derivatives ------
def _three_plain(x):
    return jnp.sin(x) * x, jnp.cos(x) ** 2, jnp.exp(x)


def _three_rrule_only():
    p = rules.primitive(_three_plain, name="three_plain")

    @p.rrule
    def three_plain_rrule(x):
        d = (jnp.cos(x) * x + jnp.sin(x), -2 * jnp.cos(x) * jnp.sin(x), jnp.exp(x))

        def three_plain_pullback(y_bar):
            parts = [g * di for g, di in zip(y_bar, d) if not isinstance(g, rules.AbstractZero)]
            return NoTangent(), sum(parts[1:], parts[0])

        return _three_plain(x), three_plain_pullback

    return p


def _loss_12(f):  # one call, outputs 1 and 2 used, 0 not: a pattern with a zero
    def loss(x):
        _, b, c = f(x)
        return jnp.sum(2 * b + 3 * c)

    return loss


def _scanned_12(f):
    return lambda x: jax.lax.scan(lambda c, _: (c + 0.1 * jnp.tanh(_loss_12(f)(c)), None), x, None, length=3)[0].sum()


_X4 = jnp.linspace(0.1, 1.0, 4)
_EVERY = {
    "hessian": lambda f: jax.hessian(_loss_12(f))(_X4),
    "jit(hessian)": lambda f: jax.jit(jax.hessian(_loss_12(f)))(_X4),
    "jit(jacrev)": lambda f: jax.jit(jax.jacrev(lambda x: f(x)[1]))(_X4),
    "jit(jvp)": lambda f: jax.jit(lambda x: jax.jvp(lambda x: f(x)[1], (x,), (jnp.ones_like(x),))[1])(_X4),
    "jit(linearize)": lambda f: jax.jit(lambda x: jax.linearize(_loss_12(f), x)[1](jnp.ones_like(x)))(_X4),
    "jit(grad(scan))": lambda f: jax.jit(jax.grad(_scanned_12(f)))(_X4),
    "hessian(scan)": lambda f: jax.hessian(_scanned_12(f))(_X4),
    "grad(checkpoint)": lambda f: jax.grad(jax.checkpoint(_loss_12(f)))(_X4),
    "hessian(jit)": lambda f: jax.hessian(jax.jit(_loss_12(f)))(_X4),
    "grad(cond)": lambda f: jax.grad(lambda x: jax.lax.cond(x[0] > 0, _loss_12(f), lambda x: 0.0, x))(_X4),
    "grad(vmap)": lambda f: jax.grad(lambda X: jnp.sum(jax.vmap(_loss_12(f))(X)))(jnp.stack([_X4, 2 * _X4])),
}


@pytest.mark.parametrize("how", list(_EVERY))
def test_every_transformation_of_a_three_output_rrule_equals_the_plain_function(how):
    ours = _three_rrule_only()
    if not _dual.ENABLED and "linearize" in how:  # JAX cannot evaluate a custom_vjp's linearization
        with pytest.raises(TypeError, match="custom_vjp"):
            _EVERY[how](ours)
        return
    np.testing.assert_allclose(_EVERY[how](ours), _EVERY[how](_three_plain), rtol=1e-6, atol=1e-7)
