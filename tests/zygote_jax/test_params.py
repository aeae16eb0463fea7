"""Params and Grads: implicit parameters held by mutable Python objects."""

import dataclasses
import threading
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zygote_jax
from zygote_jax import GradientError, Grads, Params, gradient


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)


class Pair(NamedTuple):
    u: object
    v: object


class Box:
    pass


def make_model():
    m = Box()
    m.w = jnp.array([1.0, 2.0])
    m.layers = [{"b": jnp.array([0.5, -0.5])}, Pair(jnp.array(3.0), "name")]
    m.inner = Box()
    m.inner.scale = jnp.array(2.0)
    m.inner.counts = jnp.array([1, 2])  # int arrays are not parameters
    m.inner.n = 3
    return m


def loss(m):
    return jnp.sum(m.w * m.layers[1].u * m.inner.scale) + jnp.sum(m.layers[0]["b"] ** 2)


def test_params_collects_through_attributes_lists_dicts_tuples_and_objects():
    m = make_model()
    ps = Params(m)
    assert len(ps) == 4
    for p in (m.w, m.layers[0]["b"], m.layers[1].u, m.inner.scale):
        assert p in ps
    assert m.inner.counts not in ps and jnp.array([1.0, 2.0]) not in ps  # identity, not value
    assert "Params([float64[2]" in repr(ps)
    assert [p.shape for p in ps] == [(2,), (2,), (), ()] and ps[0] is m.w


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Frozen:
    a: jax.Array
    b: jax.Array


def test_frozen_pytree_inside_a_mutable_object_is_rebuilt_and_restored():
    holder = Box()
    holder.frozen = Frozen(jnp.array(2.0), jnp.array(3.0))
    original = holder.frozen
    ps = Params(holder)
    assert len(ps) == 2
    gs = gradient(lambda: holder.frozen.a * holder.frozen.b, ps)
    assert float(gs[original.a]) == 3.0 and float(gs[original.b]) == 2.0
    assert holder.frozen is original
    ps.update(gs, lambda p, g: p - g)
    assert isinstance(holder.frozen, Frozen) and float(holder.frozen.a) == -1.0


def test_shared_arrays_count_once_and_cycles_are_fine():
    w = jnp.ones(2)
    a, b = Box(), Box()
    a.w, b.w, a.other, b.other = w, w, b, a
    ps = Params(a, [b])
    assert len(ps) == 1
    gs = gradient(lambda: jnp.sum(a.w * b.w), ps)
    close(gs[w], [2.0, 2.0])  # both uses accumulate


def test_implicit_gradient_returns_grads_indexed_by_the_arrays():
    m = make_model()
    ps = Params(m)
    gs = gradient(lambda: loss(m), ps)
    assert isinstance(gs, Grads) and len(gs) == 4
    close(gs[m.w], [6.0, 6.0])
    close(gs[m.layers[0]["b"]], [1.0, -1.0])
    close(gs[m.layers[1].u], 6.0)
    close(gs[m.inner.scale], 9.0)
    assert list(gs) == gs.keys() == list(ps)
    assert [id(k) for k, _ in gs.items()] == [id(p) for p in ps]
    close(gs.values()[0], [6.0, 6.0])
    with pytest.raises(KeyError, match="gs\\[model.weight\\]"):
        gs[jnp.ones(2)]
    assert gs.get(jnp.ones(2)) is None


def test_implicit_gradient_agrees_with_the_explicit_form():
    m = make_model()
    gs = gradient(lambda: loss(m), Params(m))

    def explicit(w, b, u, scale):
        return jnp.sum(w * u * scale) + jnp.sum(b**2)

    ge = gradient(explicit, m.w, m.layers[0]["b"], m.layers[1].u, m.inner.scale)
    for g, p in zip(ge, Params(m)):
        close(gs[p], g)


def test_model_is_restored_exactly():
    m = make_model()
    before = (m.w, m.layers, m.layers[0], m.layers[0]["b"], m.layers[1], m.inner.scale)
    ps = Params(m)
    gradient(lambda: loss(m), ps)
    after = (m.w, m.layers, m.layers[0], m.layers[0]["b"], m.layers[1], m.inner.scale)
    assert all(x is y for x, y in zip(before, after))


def test_model_is_restored_when_the_loss_raises():
    m = make_model()
    before = (m.w, m.layers[0]["b"], m.layers[1], m.inner.scale)
    ps = Params(m)

    def failing():
        loss(m)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        gradient(failing, ps)
    after = (m.w, m.layers[0]["b"], m.layers[1], m.inner.scale)
    assert all(x is y for x, y in zip(before, after))


def test_stale_params_are_an_error():
    m = make_model()
    ps = Params(m)
    m.w = jnp.zeros(2)
    with pytest.raises(GradientError, match="Params"):
        gradient(lambda: loss(m), ps)
    assert float(m.w[0]) == 0.0  # the new array is left in place


def test_update_writes_new_arrays_back():
    m = make_model()
    ps = Params(m)
    old_u = m.layers[1].u
    gs = gradient(lambda: loss(m), ps)
    ps.update(gs, lambda p, g: p - 0.1 * g)
    close(m.w, [1.0 - 0.6, 2.0 - 0.6])
    close(m.layers[1].u, 3.0 - 0.6)
    assert m.layers[1].v == "name" and m.layers[1] is not None and m.layers[1].u is not old_u
    assert m.w in ps and len(ps) == 4
    gs2 = gradient(lambda: loss(m), ps)  # the Params follow the new arrays
    close(m.inner.scale, 2.0 - 0.1 * 9.0)
    close(gs2[m.w], 2.4 * 1.1 * np.ones(2))


def test_withgradient_and_pullback_with_params():
    m = make_model()
    ps = Params(m)
    val, gs = zygote_jax.withgradient(lambda: (loss(m), "aux"), ps)
    assert val[1] == "aux" and isinstance(gs, Grads)
    y, back = zygote_jax.pullback(lambda: m.w * 2, ps)
    close(back(jnp.array([1.0, 10.0]))[m.w], [2.0, 20.0])


def test_params_errors():
    with pytest.raises(GradientError, match="(?s)no place.*explicitly"):
        Params(jnp.ones(2))  # held by nothing the loss could read
    m = make_model()
    with pytest.raises(GradientError, match="explicit"):
        zygote_jax.jacobian(lambda: m.w, Params(m))
    with pytest.raises(GradientError, match="only argument"):
        gradient(lambda x: loss(m) * x, Params(m), 2.0)


# ----- arrays given directly: `Params([m.w, m.b])` ------------------------------------------
GLOBAL_W = jnp.array([1.0, -1.0])


def test_arrays_given_directly_are_found_where_the_loss_reads_them():
    m = make_model()
    ps = Params([m.w, m.inner.scale])
    assert len(ps) == 2
    gs = gradient(lambda: loss(m), ps)
    close(gs[m.w], [6.0, 6.0])  # not zeros: the tracer is swapped into m.w, where loss reads it
    close(gs[m.inner.scale], 9.0)
    assert m.layers[1].u not in gs
    before = (m.w, m.inner.scale)
    ps.update(gs, lambda p, g: p - 0.1 * g)
    close(m.w, [0.4, 1.4])
    assert m.w is not before[0] and m.inner.scale is not before[1]
    close(gradient(lambda: loss(m), ps)[m.w], 3.0 * 1.1 * np.ones(2))


def test_arrays_given_directly_in_closures_globals_and_as_roots():
    w = jnp.array([1.0, 2.0])
    gs = gradient(lambda: jnp.sum(w**2), Params(w))  # a closure variable
    close(gs[w], [2.0, 4.0])
    gs = gradient(lambda: jnp.sum(GLOBAL_W**3), Params([GLOBAL_W]))  # a module global
    close(gs[GLOBAL_W], [3.0, 3.0])
    assert isinstance(GLOBAL_W, jax.Array) and not isinstance(GLOBAL_W, jax.core.Tracer)
    ws = [jnp.array(3.0)]  # a list the loss reads from still works
    close(gradient(lambda: ws[0] ** 2, Params(ws))[ws[0]], 6.0)


def test_arrays_given_directly_in_class_attributes_slots_and_after_jit():
    class Config:
        w = jnp.array([1.0, 2.0])

    class Slotted:
        __slots__ = ("w",)

    s = Slotted()
    s.w = jnp.array(3.0)
    jax.jit(lambda: s.w * 2)()  # JAX keeps s.w among a jaxpr's constants: not a place to swap in
    gs = gradient(lambda: jnp.sum(Config.w**2) * s.w, Params([Config.w, s.w]))
    close(gs[Config.w], [6.0, 12.0])
    close(gs[s.w], 5.0)
    assert not isinstance(Config.w, jax.core.Tracer) and not isinstance(s.w, jax.core.Tracer)


def test_array_given_directly_but_held_by_a_tuple_is_an_error():
    m = Box()
    m.pair = (jnp.array(2.0), jnp.array(3.0))
    with pytest.raises(GradientError, match="(?s)tuple.*Params\\(model\\)"):
        Params([m.pair[0]])
    gs = gradient(lambda: m.pair[0] * m.pair[1], Params(m))  # the object that holds it works
    assert float(gs[m.pair[0]]) == 3.0


# ----- threads ----------------------------------------------------------------------------------
def test_concurrent_gradients_over_the_same_params_are_serialised():
    m = make_model()
    ps = Params(m)
    w = m.w  # read before the threads start: readers outside `gradient` may see tracers
    expected = gradient(lambda: loss(m), ps)[w]

    def slow_loss():
        value = loss(m)
        time.sleep(0.02)  # the other thread runs while tracers are in the model
        return value

    results, errors = [], []

    def work():
        try:
            for _ in range(3):
                results.append(gradient(slow_loss, ps)[w])
        except Exception as err:  # noqa: BLE001 -- reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 6
    for g in results:
        close(g, expected)
    assert not isinstance(m.w, jax.core.Tracer)


def test_a_loss_that_reads_only_copies_of_the_parameters_is_an_error():
    # a function jitted before keeps its own copy of the arrays it closed over: the loss
    # would depend on no parameter, and every gradient would be zero, silently
    class Model:
        pass

    m = Model()
    m.w, m.b = jnp.array([1.0, 2.0]), jnp.array(0.5)
    cached = jax.jit(lambda: jnp.sum(3 * m.w) + m.b)
    cached()
    with pytest.raises(zygote_jax.GradientError, match="read none of the 2 parameters"):
        zygote_jax.gradient(lambda: cached(), zygote_jax.Params(m))
    with pytest.raises(zygote_jax.GradientError, match="read none of the 1 parameters"):
        zygote_jax.gradient(lambda: jnp.sum(3 * m.w), zygote_jax.Params([[m.w]]))  # a list in a list


def test_a_parameter_the_loss_does_not_read_gets_none_as_in_zygote():
    class Model:
        pass

    m = Model()
    m.w, m.b = jnp.array([1.0, 2.0]), jnp.array(0.5)
    gs = zygote_jax.gradient(lambda: jnp.sum(3 * m.w), zygote_jax.Params(m))
    np.testing.assert_allclose(gs[m.w], [3.0, 3.0])
    assert gs[m.b] is None
