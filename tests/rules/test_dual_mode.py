"""Both modes from every rule (rules/_dual.py): forward mode runs the frule, reverse mode the
rrule, whatever JAX traced first (jit, scan, checkpoint) and also for jax.linearize.

The routes run on both footings (`footing`): with the linearization rule that `rules_call`
gets where this JAX's contract is known, and with the JVP and transpose rules alone, as on a
JAX whose linearization contract is not.

The primitives here have deliberately wrong rules that tell the routes apart: an frule 5x
the derivative and an rrule 7x, so a test fails if any transformation takes the other rule.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
from rules import NoTangent, _dual

X = jnp.array([0.5, -1.0, 2.0])
ONES = jnp.ones(3)
FRULE, RRULE = 5 * 3 * X**2, 7 * 3 * X**2  # what each (wrong) rule says d(x^3)/dx is

@pytest.fixture(params=["linearization rule", "JVP rule alone"])
def footing(request, monkeypatch):
    _dual.check_footing()
    registered = _dual.LINEARIZATIONS is not None and _dual.rules_call_p in _dual.LINEARIZATIONS
    if request.param == "JVP rule alone" and registered:
        monkeypatch.delitem(_dual.LINEARIZATIONS, _dual.rules_call_p)
    elif request.param == "linearization rule":
        assert registered, "this JAX's linearization contract is not one rules knows (rules/_jax_compat.py)"
    return request.param


needs_dual = pytest.mark.skipif(not _dual.ENABLED, reason="the dual-mode lowering is off: this JAX lacks its internals, or ZYGOTE_JAX_LOWERING=custom_vjp (fallback tested below)")


def make_both():
    both = rules.primitive(lambda x: x**3, name="both")

    @both.rrule
    def both_rrule(x):
        return both(x), lambda y_bar: (NoTangent(), y_bar * 7 * 3 * x**2)

    @both.frule
    def both_frule(tangents, x):
        return both(x), 5 * 3 * x**2 * tangents[1]

    return both


def make_rrule_only():
    @rules.primitive
    def cube(x):
        return x**3

    @cube.rrule
    def cube_rrule(x):
        return cube(x), lambda y_bar: (NoTangent(), y_bar * 7 * 3 * x**2)

    return cube


def make_looped():
    """An rrule whose pullback JAX cannot transpose: reverse mode only."""

    @rules.primitive
    def looped(x):
        return 2 * x

    @looped.rrule
    def looped_rrule(x):
        def looped_pullback(y_bar):
            _, x_bar = jax.lax.while_loop(lambda c: c[0] < 1, lambda c: (c[0] + 1, 2 * c[1]), (0, y_bar))
            return NoTangent(), x_bar

        return looped(x), looped_pullback

    return looped


def in_scan(f):
    """f applied once inside a lax.scan body (traced to a jaxpr before any differentiation)."""
    return lambda x: jax.lax.scan(lambda c, _: (f(c), None), x, None, length=1)[0]


def in_cond(f):
    return lambda x: jax.lax.cond(True, f, lambda x: x, x)


# each: the derivative of an elementwise f along ones, by forward mode
FORWARD = {
    "jvp": lambda f: jax.jvp(f, (X,), (ONES,))[1],
    "jit(jvp)": lambda f: jax.jit(lambda x: jax.jvp(f, (x,), (ONES,))[1])(X),
    "jvp(jit)": lambda f: jax.jvp(jax.jit(f), (X,), (ONES,))[1],
    "jacfwd": lambda f: jnp.diagonal(jax.jacfwd(f)(X)),
    "jacfwd(jit)": lambda f: jnp.diagonal(jax.jacfwd(jax.jit(f))(X)),
    "vmap(jvp)": lambda f: jax.vmap(lambda x: jax.jvp(f, (x,), (1.0,))[1])(X),
    "jvp(vmap)": lambda f: jax.jvp(jax.vmap(f), (X,), (ONES,))[1],
    "linearize": lambda f: jax.linearize(f, X)[1](ONES),
    "linearize(jit)": lambda f: jax.linearize(jax.jit(f), X)[1](ONES),
    "jit(linearize)": lambda f: jax.jit(lambda x: jax.linearize(f, x)[1](ONES))(X),
    "linearize(vmap)": lambda f: jax.linearize(jax.vmap(f), X)[1](ONES),
    "vmap(linearize)": lambda f: jax.vmap(lambda x: jax.linearize(f, x)[1](1.0))(X),
    "jvp(scan)": lambda f: jax.jvp(in_scan(f), (X,), (ONES,))[1],
    "linearize(scan)": lambda f: jax.linearize(in_scan(f), X)[1](ONES),
    "jvp(cond)": lambda f: jax.jvp(in_cond(f), (X,), (ONES,))[1],
    "jvp(checkpoint)": lambda f: jax.jvp(jax.checkpoint(f), (X,), (ONES,))[1],
}

# each: the gradient of sum(f), by reverse mode
REVERSE = {
    "grad": lambda f: jax.grad(lambda x: jnp.sum(f(x)))(X),
    "jit(grad)": lambda f: jax.jit(jax.grad(lambda x: jnp.sum(f(x))))(X),
    "grad(jit)": lambda f: jax.grad(lambda x: jnp.sum(jax.jit(f)(x)))(X),
    "vmap(grad)": lambda f: jax.vmap(jax.grad(f))(X),
    "grad(vmap)": lambda f: jax.grad(lambda x: jnp.sum(jax.vmap(f)(x)))(X),
    "jacrev": lambda f: jnp.diagonal(jax.jacrev(f)(X)),
    "grad(scan)": lambda f: jax.grad(lambda x: jnp.sum(in_scan(f)(x)))(X),
    "grad(cond)": lambda f: jax.grad(lambda x: jnp.sum(in_cond(f)(x)))(X),
    "grad(checkpoint)": lambda f: jax.grad(lambda x: jnp.sum(jax.checkpoint(f)(x)))(X),
    "jit(grad(checkpoint))": lambda f: jax.jit(jax.grad(lambda x: jnp.sum(jax.checkpoint(f)(x))))(X),
    "vjp(jit)": lambda f: jax.vjp(jax.jit(f), X)[1](ONES)[0],
    "transpose(linearize)": lambda f: jax.linear_transpose(jax.linearize(f, X)[1], X)(ONES)[0],
}


@needs_dual
@pytest.mark.parametrize("route", list(FORWARD))
def test_forward_mode_runs_the_frule_whatever_was_traced_first(route, footing):
    np.testing.assert_allclose(FORWARD[route](make_both()), FRULE, rtol=1e-12)


@needs_dual
@pytest.mark.parametrize("route", list(REVERSE))
def test_reverse_mode_runs_the_rrule_whatever_was_traced_first(route, footing):
    np.testing.assert_allclose(REVERSE[route](make_both()), RRULE, rtol=1e-12)


@needs_dual
@pytest.mark.parametrize("route", ["jvp", "jvp(jit)", "linearize", "linearize(jit)", "vmap(linearize)", "linearize(scan)"])
def test_forward_mode_of_an_rrule_alone_transposes_its_pullback(route, footing):
    np.testing.assert_allclose(FORWARD[route](make_rrule_only()), RRULE, rtol=1e-12)


@needs_dual
def test_one_function_traced_once_serves_both_modes(footing):
    both, traces = make_both(), []

    @jax.jit
    def f(x):
        traces.append(x)
        return both(x)

    np.testing.assert_allclose(jax.jvp(f, (X,), (ONES,))[1], FRULE, rtol=1e-12)
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(f(x)))(X), RRULE, rtol=1e-12)
    np.testing.assert_allclose(jax.linearize(f, X)[1](ONES), FRULE, rtol=1e-12)
    assert len(traces) == 1  # one trace, one primitive that keeps both rules
    assert "rulescall[both]" in str(jax.make_jaxpr(both)(X))
    assert "pushforward of both" in str(jax.make_jaxpr(lambda x: jax.jvp(both, (x,), (ONES,)))(X))


@needs_dual
def test_second_order_differentiates_the_rule_that_served_first(footing):
    both = make_both()
    # forward over reverse (jax.hessian): the pullback y_bar * 7 * 3x^2, differentiated
    np.testing.assert_allclose(jnp.diagonal(jax.hessian(lambda x: jnp.sum(both(x)))(X)), 7 * 6 * X, rtol=1e-12)
    # reverse over forward and forward over forward: the frule's tangent 5 * 3x^2, differentiated
    tangent = lambda x: jnp.sum(jax.jvp(both, (x,), (ONES,))[1])  # noqa: E731
    np.testing.assert_allclose(jax.grad(tangent)(X), 5 * 6 * X, rtol=1e-12)
    np.testing.assert_allclose(jax.jvp(jax.grad(tangent), (X,), (ONES,))[1], 5 * 6 * ONES, rtol=1e-12)
    np.testing.assert_allclose(jax.jvp(lambda x: jax.jvp(both, (x,), (ONES,))[1], (X,), (ONES,))[1], 5 * 6 * X)


@needs_dual
def test_a_pullback_jax_cannot_transpose_serves_reverse_mode_and_says_why_forward_mode_fails(footing):
    looped = make_looped()
    for route in ("grad", "jit(grad)", "grad(checkpoint)", "grad(scan)"):  # the transposition runs the rrule
        np.testing.assert_allclose(REVERSE[route](looped), 2 * ONES)
    for route in ("jvp", "jit(jvp)", "jvp(jit)", "jacfwd", "linearize", "jvp(scan)"):
        with pytest.raises(rules.ForwardModeError, match=r"looped`.*cannot be transposed"):
            jax.block_until_ready(FORWARD[route](looped))
    # jax.jit defers the error to compilation; inside forward_mode_required it comes when traced
    with _dual.forward_mode_required(), pytest.raises(rules.ForwardModeError, match="while_loop"):
        jax.make_jaxpr(lambda x: jax.jvp(looped, (x,), (x,)))(X)
    jax.make_jaxpr(lambda x: jax.jvp(looped, (x,), (x,)))(X)  # outside it: traced (checkpoint needs that)


@pytest.fixture
def custom_vjp_lowering(monkeypatch):
    """The fallback lowering (a JAX without the dual-mode internals): jax.custom_vjp / jax.custom_jvp."""
    monkeypatch.setattr(_dual, "ENABLED", False)


def test_the_custom_vjp_fallback_chooses_the_mode_when_called(custom_vjp_lowering):
    both = make_both()
    for route in ("jvp", "jit(jvp)", "jacfwd", "vmap(jvp)"):
        np.testing.assert_allclose(FORWARD[route](both), FRULE, rtol=1e-12)
    for route in ("grad", "jit(grad)", "grad(jit)", "vmap(grad)", "grad(scan)", "grad(checkpoint)"):
        np.testing.assert_allclose(REVERSE[route](both), RRULE, rtol=1e-12)
    assert "custom_vjp_call" in str(jax.make_jaxpr(both)(X))
    np.testing.assert_allclose(jnp.diagonal(jax.hessian(lambda x: jnp.sum(both(x)))(X)), 7 * 6 * X, rtol=1e-12)
    # what it cannot do: forward mode through a trace made for reverse mode (jax.custom_vjp)
    with pytest.raises(Exception, match="custom_vjp"):
        FORWARD["linearize"](both)
    with pytest.raises(Exception, match="custom_vjp"):
        FORWARD["jvp(jit)"](both)


@needs_dual
def test_both_modes_under_shard_map():
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((8,), ("x",), devices=jax.devices("cpu"))  # the root conftest's 8 CPUs
    x = jax.device_put(jnp.linspace(-1.0, 2.0, 8), NamedSharding(mesh, P("x")))
    both = make_both()
    sharded = jax.shard_map(both, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    ones = jax.device_put(jnp.ones(8), NamedSharding(mesh, P("x")))
    np.testing.assert_allclose(jax.jvp(sharded, (x,), (ones,))[1], 5 * 3 * x**2, rtol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.linearize(sharded, x)[1])(ones), 5 * 3 * x**2, rtol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: jnp.sum(sharded(x))))(x), 7 * 3 * x**2, rtol=1e-12)


@needs_dual
def test_grad_of_vmap_keeps_an_unbatched_residual_unbatched(footing):
    @rules.primitive
    def layer(W, x):
        return jnp.tanh(W @ x)

    @layer.rrule
    def layer_rrule(W, x):
        y = jnp.tanh(W @ x)

        def layer_pullback(y_bar):
            s = y_bar * (1 - y**2)
            return NoTangent(), jnp.outer(s, x), W.T @ s

        return y, layer_pullback

    W, xs = jnp.arange(12.0).reshape(3, 4) / 10, jnp.arange(20.0).reshape(5, 4) / 7
    loss = lambda W, xs: jnp.sum(jax.vmap(layer, in_axes=(None, 0))(W, xs) ** 2)  # noqa: E731
    plain = lambda W, xs: jnp.sum(jnp.tanh(xs @ W.T) ** 2)  # noqa: E731
    for got, want in zip(jax.grad(loss, argnums=(0, 1))(W, xs), jax.grad(plain, argnums=(0, 1))(W, xs)):
        np.testing.assert_allclose(got, want, rtol=1e-10)
    # W is a residual of the batched forward pass: used as it is, never broadcast to (5, 3, 4)
    # (the pullback's own per-example outer products are (5, 3, 4): count the broadcasts of W)
    jaxpr = jax.make_jaxpr(jax.grad(loss))(W, xs).jaxpr
    w_var = jaxpr.invars[0]
    broadcasts = [e for e in jaxpr.eqns if e.primitive.name == "broadcast_in_dim" and w_var in e.invars]
    assert broadcasts == []


@needs_dual
def test_a_forward_mode_op_and_a_reverse_mode_op_of_one_call_compare_unequal_without_raising():
    # CI once failed when JAX compared the two: PyTreeDef's == raises on None
    (eqn,) = [e for e in jax.make_jaxpr(make_both())(X).eqns if "op" in e.params]
    call = eqn.params["op"]
    forward = _dual._Linear(call, (0,), None, [])  # made without residuals
    reverse = _dual._Linear(call, (0,), jax.tree_util.tree_structure(()), [])  # same avals: only the tree differs
    assert forward != reverse and reverse != forward
    assert forward == _dual._Linear(call, (0,), None, []) and hash(forward) == hash(_dual._Linear(call, (0,), None, []))
    assert reverse == _dual._Linear(call, (0,), jax.tree_util.tree_structure(()), [])
