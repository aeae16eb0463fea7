"""The testers are never stale: a check runs the code as it is now, whatever it reads.

Each scenario checks a right rule, changes something the rule reads in a way that keeps it
right (the check must still pass: no false failure), then in a way that makes it 1% wrong
(the check must fail: nothing kept from the earlier checks may hide the change). Every
check traces the rule again, and only a compilation of the very same lowered program is
reused (`rules/testing/_compiled.py`), so none of these needs a rule of its own; the
scenarios are the ways a reused trace went stale before (issue 25), one per cause.
"""

from __future__ import annotations

import abc
import array
import ctypes
import dataclasses
import decimal
import fractions
import functools
import os
import sys
import textwrap
import types
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
from rules import NoTangent
from rules.testing import test_frule, test_rrule

X = jnp.array([0.3, -1.2, 0.7])


def _module(name: str, source: str, **names) -> types.ModuleType:
    """User code in a module of its own (as a notebook cell or a test file defines it)."""
    module = types.ModuleType(name)
    vars(module).update(names)
    exec("import jax\nimport jax.numpy as jnp\nimport numpy as np\nimport rules\n" + textwrap.dedent(source),
         vars(module))
    return module


def _sin_reading(scale_of) -> rules.Primitive:
    """A fresh primitive sin whose pullback multiplies by `scale_of()`: right while it is 1."""

    @rules.primitive
    def mysin(x):
        return jnp.sin(x)

    @mysin.rrule
    def mysin_rrule(x):
        scale = scale_of()
        return jnp.sin(x), lambda y_bar: (NoTangent(), scale * rules.unthunk(y_bar) * jnp.cos(x))

    return mysin


def _env():
    os.environ["ZJ_SCALE"] = "1"
    f = _sin_reading(lambda: float(os.environ["ZJ_SCALE"]))
    return f, (X,), lambda: os.environ.__setitem__("ZJ_SCALE", "1.000"), \
        lambda: os.environ.__setitem__("ZJ_SCALE", "1.01")


def _getenv():
    os.environ["ZJ_SCALE2"] = "1"
    f = _sin_reading(lambda: float(os.getenv("ZJ_SCALE2", "1")))
    return f, (X,), lambda: os.environ.pop("ZJ_SCALE2"), lambda: os.environ.__setitem__("ZJ_SCALE2", "1.01")


def _decimal_context():
    context = decimal.Context(prec=28)
    f = _sin_reading(lambda: float(context.multiply(context.divide(1, 3), 3)))  # 0.99..9 at prec 28
    return f, (X,), lambda: setattr(context, "prec", 40), lambda: setattr(context, "prec", 2)


def _builtin_name():
    import builtins

    builtins.ZJ_SCALE = 1.0
    m = _module("zj_builtins", "def scale():\n    return ZJ_SCALE\n")  # found in builtins
    return _sin_reading(m.scale), (X,), lambda: setattr(builtins, "ZJ_SCALE", 1), \
        lambda: setattr(builtins, "ZJ_SCALE", 1.01)


def _relative_lazy_import(tmp_path):
    package = tmp_path / "zj_lazy_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "cfg.py").write_text("S = 1.0\n")
    (package / "rule.py").write_text("def scale():\n    from .cfg import S\n    return S\n")
    sys.path.insert(0, str(tmp_path))
    import zj_lazy_pkg.cfg as cfg
    import zj_lazy_pkg.rule as rule

    return _sin_reading(rule.scale), (X,), lambda: setattr(cfg, "S", 1), lambda: setattr(cfg, "S", 1.01)


def _frame_globals():
    m = _module("zj_frames", """
        import sys
        S = 1.0
        def scale():
            return sys._getframe().f_globals["S"]
    """)
    return _sin_reading(m.scale), (X,), lambda: setattr(m, "S", 1), lambda: setattr(m, "S", 1.01)


def _function_globals():
    m = _module("zj_fn_globals", "S = 1.0\ndef helper():\n    pass\n")
    return _sin_reading(lambda: m.helper.__globals__["S"]), (X,), lambda: setattr(m, "S", 1), \
        lambda: setattr(m, "S", 1.01)


def _aliased_eval():
    m = _module("zj_eval", "S = 1.0\nlook = eval\ndef scale():\n    return look('S')\n")
    return _sin_reading(m.scale), (X,), lambda: setattr(m, "S", 1), lambda: setattr(m, "S", 1.01)


def _wrapped():
    def one():
        return 1.0

    @functools.wraps(one)
    def outer():
        return outer.__wrapped__()

    return _sin_reading(outer), (X,), lambda: setattr(outer, "__wrapped__", lambda: 1), \
        lambda: setattr(outer, "__wrapped__", lambda: 1.01)


class _Doubles(array.array):
    pass


def _array_subclass():
    held = _Doubles("d", [1.0])
    return _sin_reading(lambda: held[0]), (X,), lambda: held.__setitem__(0, 1), lambda: held.__setitem__(0, 1.01)


def _bytearray():
    held = bytearray(b"\x64")  # 100
    return _sin_reading(lambda: held[0] / 100), (X,), lambda: held.append(7), lambda: held.__setitem__(0, 101)


def _fraction():
    held = [fractions.Fraction(1)]
    return _sin_reading(lambda: float(held[0])), (X,), lambda: held.__setitem__(0, fractions.Fraction(3, 3)), \
        lambda: held.__setitem__(0, fractions.Fraction(101, 100))


def _ctypes_value():
    held = ctypes.c_double(1.0)
    return _sin_reading(lambda: held.value), (X,), lambda: setattr(held, "value", 1), \
        lambda: setattr(held, "value", 1.01)


class _Tagged(np.ndarray):
    pass


def _ndarray_subclass_attribute():
    held = np.ones(3).view(_Tagged)
    held.scale = 1.0
    return _sin_reading(lambda: held.scale), (X,), lambda: setattr(held, "scale", 1), \
        lambda: setattr(held, "scale", 1.01)


def _lru_cache():
    state = {"S": 1.0}

    @functools.lru_cache(maxsize=None)
    def scale():
        return state["S"]

    def wrong():
        state["S"] = 1.01
        scale.cache_clear()

    return _sin_reading(scale), (X,), lambda: scale.cache_clear(), wrong


def _random_reseeded():
    import random

    rng = random.Random()
    good = next(s for s in range(100) if random.Random(s).random() < 0.5)
    bad = next(s for s in range(100) if random.Random(s).random() >= 0.5)
    other_good = next(s for s in range(good + 1, 200) if random.Random(s).random() < 0.5)
    seed = [good]

    def scale():
        rng.seed(seed[0])
        return 1.0 if rng.random() < 0.5 else 1.01

    return _sin_reading(scale), (X,), lambda: seed.__setitem__(0, other_good), lambda: seed.__setitem__(0, bad)


def _weakref_proxy():
    class Holder:
        scale = 1.0

    holder = Holder()
    proxy = weakref.proxy(holder)
    f = _sin_reading(lambda: proxy.scale)
    f.keep_alive = holder  # the proxy's target lives as long as the rule
    return f, (X,), lambda: setattr(holder, "scale", 1), lambda: setattr(holder, "scale", 1.01)


def _frompyfunc():
    state = {"S": 1.0}
    ufunc = np.frompyfunc(lambda v: state["S"] * v, 1, 1)
    return _sin_reading(lambda: float(ufunc(1.0))), (X,), lambda: state.__setitem__("S", 1), \
        lambda: state.__setitem__("S", 1.01)


def _device_put_shared():
    source = np.ones(3)
    held = jax.device_put(source)  # on CPU it may share the NumPy buffer (then it changes with it)
    f = _sin_reading(lambda: held)

    def wrong():
        source[:] = 1.01
        return bool(np.asarray(held)[0] != 1.0)  # a copy stays right: then the check must pass

    return f, (X,), lambda: source.__setitem__(slice(None), 1.0), wrong


def _nested_jaxpr_constant():
    held = [np.ones(3)]

    def scaled_cos(x):
        c = held[0]  # a constant of the custom_jvp's inner jaxpr, which the jaxpr text does not print

        @jax.custom_jvp
        def g(v):
            return jnp.cos(v) * c

        g.defjvp(lambda p, t: (g(p[0]), -jnp.sin(p[0]) * c * t[0]))
        return g(x)

    @rules.primitive
    def mysin(x):
        return jnp.sin(x)

    @mysin.rrule
    def mysin_rrule(x):
        return jnp.sin(x), lambda y_bar: (NoTangent(), rules.unthunk(y_bar) * scaled_cos(x))

    return mysin, (X,), lambda: held.__setitem__(0, np.ones(3).copy()), \
        lambda: held.__setitem__(0, np.full(3, 1.01))


def _big(scale: float = 1.0) -> np.ndarray:
    """An array of more bytes than `jax_embedded_constants_max_bytes` (1024): as a constant of
    a trace, JAX >= 0.11 passes it to the executable as an argument, which the lowered text
    does not show; only its first 3 entries are read (`* scale`)."""
    big = np.linspace(1.0, 2.0, 300)
    big[:3] = scale
    return big


def _hoisted_constant_in_the_rule():
    """The pullback reads a large array through a nested `jax.jit` (its constant, not the
    program's): the program's executable receives it as an argument."""
    held = [_big()]

    @rules.primitive
    def mysin(x):
        return jnp.sin(x)

    @mysin.rrule
    def mysin_rrule(x):
        scale = jax.jit(lambda v: v * jnp.asarray(held[0])[:3])
        return jnp.sin(x), lambda y_bar: (NoTangent(), scale(rules.unthunk(y_bar) * jnp.cos(x)))

    return mysin, (X,), lambda: held.__setitem__(0, _big().copy()), lambda: held.__setitem__(0, _big(1.01))


def _hoisted_constant_in_f():
    """f reads a large array through a nested `jax.jit` and the rule does not: changed, the
    rule is wrong, which finite differences of f as it is now must see."""
    held = [_big()]

    @rules.primitive
    def scaled_sin(x):
        return jax.jit(lambda v: jnp.sin(v) * jnp.asarray(held[0])[:3])(x)

    @scaled_sin.rrule
    def scaled_sin_rrule(x):
        return scaled_sin(x), lambda y_bar: (NoTangent(), rules.unthunk(y_bar) * jnp.cos(x))

    return scaled_sin, (X,), lambda: held.__setitem__(0, _big().copy()), lambda: held.__setitem__(0, _big(1.01))


def _jax_primitive(scale):
    """A JAX primitive named zj_scale multiplying by `scale`, with impl, abstract eval,
    lowering, JVP and transpose: two of them print alike in a jaxpr."""
    from jax.interpreters import ad, batching, mlir

    p = jax.extend.core.Primitive("zj_scale")
    p.def_impl(lambda x: x * scale)
    p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    mlir.register_lowering(p, mlir.lower_fun(lambda x: x * scale, multiple_results=False))
    ad.deflinear2(p, lambda ct, x: [p.bind(ct)])
    batching.defvectorized(p)
    return p


def _two_primitives_of_one_name():
    current = [_jax_primitive(1.0)]

    @rules.primitive
    def mysin(x):
        return jnp.sin(x)

    @mysin.rrule
    def mysin_rrule(x):
        p = current[0]
        return jnp.sin(x), lambda y_bar: (NoTangent(), p.bind(rules.unthunk(y_bar) * jnp.cos(x)))

    return mysin, (X,), lambda: current.__setitem__(0, _jax_primitive(1.0)), \
        lambda: current.__setitem__(0, _jax_primitive(1.01))


def _lowering_replaced():
    from jax.interpreters import mlir

    p = _jax_primitive(1.0)

    @rules.primitive
    def mysin(x):
        return jnp.sin(x)

    @mysin.rrule
    def mysin_rrule(x):
        return jnp.sin(x), lambda y_bar: (NoTangent(), p.bind(rules.unthunk(y_bar) * jnp.cos(x)))

    def lowering(scale):
        mlir.register_lowering(p, mlir.lower_fun(lambda x: x * scale, multiple_results=False))
        p.def_impl(lambda x: x * scale)

    return mysin, (X,), lambda: lowering(1.0), lambda: lowering(1.01)


def _file_read(tmp_path):
    path = tmp_path / "scale.txt"
    path.write_text("1.0")
    return _sin_reading(lambda: float(path.read_text())), (X,), lambda: path.write_text("1"), \
        lambda: path.write_text("1.01")


def _np_load(tmp_path):
    path = tmp_path / "scale.npy"
    np.save(path, np.ones(3))
    f = _sin_reading(lambda: np.load(path))
    return f, (X,), lambda: np.save(path, np.ones(3) + 0.0), lambda: np.save(path, np.full(3, 1.01))


def _projection_patched(monkeypatch):
    @rules.primitive
    def mysin(x):
        return jnp.sin(x)

    @mysin.rrule
    def mysin_rrule(x):
        project = rules.ProjectTo(x)
        return jnp.sin(x), lambda y_bar: (NoTangent(), project(rules.unthunk(y_bar) * jnp.cos(x)))

    original = rules.ProjectTo.__call__
    return mysin, (X,), lambda: monkeypatch.setattr(rules.ProjectTo, "__call__", lambda self, dx: original(self, dx)), \
        lambda: monkeypatch.setattr(rules.ProjectTo, "__call__", lambda self, dx: original(self, 1.01 * dx))


def _numpy_patched(monkeypatch):
    hypot = np.hypot
    f = _sin_reading(lambda: float(np.hypot(0.6, 0.8)))
    return f, (X,), lambda: monkeypatch.setattr(np, "hypot", lambda a, b: hypot(b, a)), \
        lambda: monkeypatch.setattr(np, "hypot", lambda a, b: 1.01 * hypot(a, b))


# Pytree arguments whose static (aux) data the rule reads.
@jax.tree_util.register_static
class _Liar:
    """Static data that claims to equal any other: only its value tells them apart."""

    def __init__(self, scale):
        self.scale = scale

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Box:
    x: jax.Array
    meta: object = dataclasses.field(metadata=dict(static=True))


def _box_rule(read):
    """f(box) = read(meta) * sin(x), whose pullback always uses 1: right while read(meta) is 1."""

    @rules.primitive
    def boxsin(box):
        return read(box.meta) * jnp.sin(box.x)

    @boxsin.rrule
    def boxsin_rrule(box):
        return boxsin(box), lambda y_bar: (NoTangent(), _Box(rules.unthunk(y_bar) * jnp.cos(box.x), box.meta))

    return boxsin


def _aux_signed_zero():
    f = _box_rule(lambda meta: float(np.copysign(1.0, meta)))
    box = _Box(X, 0.0)
    return f, (box,), lambda: None, lambda: setattr(box, "meta", -0.0)


def _aux_bool_and_int():
    f = _box_rule(lambda meta: 1.0 if meta is True else 1.01)
    box = _Box(X, True)
    return f, (box,), lambda: None, lambda: setattr(box, "meta", 1)


def _aux_lying_eq():
    f = _box_rule(lambda meta: meta.scale)
    box = _Box(X, _Liar(1.0))
    return f, (box,), lambda: setattr(box, "meta", _Liar(1)), lambda: setattr(box, "meta", _Liar(1.01))


def _aux_mutated():
    class Meta:
        scale = 1.0

    meta = Meta()
    f = _box_rule(lambda m: m.scale)
    return f, (_Box(X, meta),), lambda: setattr(meta, "scale", 1), lambda: setattr(meta, "scale", 1.01)


def _aux_function_reading_a_global():
    m = _module("zj_aux_fn", "S = 1.0\ndef scale():\n    return S\n")
    f = _box_rule(lambda fn: fn())
    return f, (_Box(X, m.scale),), lambda: setattr(m, "S", 1), lambda: setattr(m, "S", 1.01)


def _partial_callback():
    state = {"S": 1.0}
    held = jax.tree_util.Partial(lambda: state["S"])

    @rules.primitive
    def psin(p, x):
        return p() * jnp.sin(x)

    @psin.rrule
    def psin_rrule(p, x):
        return psin(p, x), lambda y_bar: (NoTangent(), NoTangent(), rules.unthunk(y_bar) * jnp.cos(x))

    return psin, (held, X), lambda: state.__setitem__("S", 1), lambda: state.__setitem__("S", 1.01)


def _abc_registered():
    class Kind(abc.ABC):
        pass

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Point:
        x: jax.Array

    @rules.primitive
    def psin(p):
        return jnp.sin(p.x)

    def rule(scale):
        def psin_rrule(p):
            return jnp.sin(p.x), lambda y_bar: (NoTangent(), Point(scale * rules.unthunk(y_bar) * jnp.cos(p.x)))

        return psin_rrule

    rules.rrule.register(psin, rule(1.0), types=(object,))
    rules.rrule.register(psin, rule(1.01), types=(Kind,))  # applies once Point is a Kind
    return psin, (Point(X),), lambda: None, lambda: Kind.register(Point)


def _which_closed_over_array():
    """f reads one of two closed-over arrays of one shape and reduces the other to nothing
    used: the finite differences' program takes f's constants as arguments and JAX drops an
    unused one, so the two programs print alike and differ in which argument they read."""
    c1, c2 = np.array([1.0, 1.5, 2.0]), np.array([5.0, 7.0, 9.0])
    state = {"f": c1, "rule": c1}

    @rules.primitive
    def scaled_sin(x):  # both arrays are constants of its trace, in the order they are met
        if state["f"] is c1:
            y, _ = jnp.sin(x) * c1, jnp.sum(c2)  # a diagnostic left in, unused
        else:
            _, y = jnp.sum(c1), jnp.sin(x) * c2
        return y

    @scaled_sin.rrule
    def scaled_sin_rrule(x):
        c = state["rule"]
        return scaled_sin(x), lambda y_bar: (NoTangent(), rules.unthunk(y_bar) * jnp.cos(x) * c)

    return scaled_sin, (X,), lambda: state.update(f=c2, rule=c2), lambda: state.update(rule=c2 * 1.01)


def _which_argument():
    """A plain JAX f (its own derivative checked) reads one of two arguments of one shape,
    the other unused: the check's program drops it, and the two programs print alike."""
    from rules.testing import with_tangent

    state = {"b": False}

    def f(x, a, b):
        return jnp.sin(x) * (b if state["b"] else a)

    a, b = with_tangent(jnp.array([1.0, 1.5, 2.0]), NoTangent()), with_tangent(jnp.array([5.0, 7.0, 9.0]), NoTangent())
    return f, (X, a, b), lambda: state.update(b=True), lambda: False  # JAX's own derivative stays right


SCENARIOS = {
    "os.environ": _env,
    "os.getenv": _getenv,
    "a decimal context": _decimal_context,
    "a builtin name": _builtin_name,
    "a relative import inside a function": _relative_lazy_import,
    "frame globals": _frame_globals,
    "fn.__globals__": _function_globals,
    "an aliased eval": _aliased_eval,
    "__wrapped__": _wrapped,
    "an array.array subclass": _array_subclass,
    "a bytearray": _bytearray,
    "a Fraction": _fraction,
    "a ctypes value": _ctypes_value,
    "an ndarray subclass's attribute": _ndarray_subclass_attribute,
    "an lru_cache": _lru_cache,
    "random reseeded": _random_reseeded,
    "a weakref proxy": _weakref_proxy,
    "np.frompyfunc": _frompyfunc,
    "a device_put array sharing its NumPy source": _device_put_shared,
    "a nested jaxpr's constant": _nested_jaxpr_constant,
    "a large constant of a nested jit, in the rule": _hoisted_constant_in_the_rule,
    "a large constant of a nested jit, in f": _hoisted_constant_in_f,
    "two JAX primitives of one name": _two_primitives_of_one_name,
    "a primitive's lowering replaced": _lowering_replaced,
    "a file read while tracing": _file_read,
    "np.load": _np_load,
    "ProjectTo.__call__ patched": _projection_patched,
    "a NumPy function patched": _numpy_patched,
    "static data 0.0 then -0.0": _aux_signed_zero,
    "static data True then 1": _aux_bool_and_int,
    "static data with a lying __eq__": _aux_lying_eq,
    "static data mutated": _aux_mutated,
    "static data: a function reading a global": _aux_function_reading_a_global,
    "a Partial's callback": _partial_callback,
    "dispatch by abc.ABC.register": _abc_registered,
    "which of two closed-over arrays f reads": _which_closed_over_array,
    "which of two arguments f reads": _which_argument,
}


def _call(make, request):
    """`make()` with the fixtures it names (tmp_path, monkeypatch): (f, args, keep, wrong),
    f right at args; `keep()` changes what f reads and leaves it right; `wrong()` makes it
    1% wrong (or returns False where the change turned out to leave it right)."""
    import inspect

    names = inspect.signature(make).parameters
    return make(*(request.getfixturevalue(n) for n in names))


@pytest.mark.parametrize("cause", list(SCENARIOS))
def test_a_check_after_a_change_checks_the_code_as_it_is_now(cause, request):
    import builtins

    saved_env, saved_path = dict(os.environ), list(sys.path)
    try:
        f, args, keep, wrong = _call(SCENARIOS[cause], request)
        test_rrule(f, *args)
        keep()
        test_rrule(f, *args)  # still right: passes (no false failure)
        if wrong() is False:  # the change left the rule right after all (said by the scenario)
            test_rrule(f, *args)
            return
        with pytest.raises(AssertionError, match="does not match finite differences|differs"):
            test_rrule(f, *args)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        for name in [n for n in sys.modules if n.startswith("zj_lazy_pkg")]:
            del sys.modules[name]
        if hasattr(builtins, "ZJ_SCALE"):
            del builtins.ZJ_SCALE


def test_an_frule_check_after_a_change_checks_the_code_as_it_is_now():
    """test_frule too: a pushforward reading a global that changes between two checks."""
    m = _module("zj_frule_reads", "S = 1.0\n")

    @rules.primitive
    def mycos(x):
        return jnp.cos(x)

    @mycos.frule
    def mycos_frule(dots, x):
        return jnp.cos(x), -m.S * jnp.sin(x) * dots[1]

    test_frule(mycos, X)
    m.S = 1.01
    with pytest.raises(AssertionError, match="tangent does not match finite differences"):
        test_frule(mycos, X)


@pytest.mark.parametrize("make", [_hoisted_constant_in_the_rule, _hoisted_constant_in_f])
def test_a_large_constant_of_a_nested_jit_is_read_as_it_is_now_by_every_check(make):
    """With `check_jit=False` too (the finite differences' programs alone are compiled), and
    by test_frule of a custom_jvp whose jvp reads it: JAX passes such a constant to the
    executable as an argument, so a kept executable would run with the old array."""
    f, args, _, wrong = make()
    test_rrule(f, *args, check_jit=False)
    wrong()
    with pytest.raises(AssertionError, match="does not match finite differences"):
        test_rrule(f, *args, check_jit=False)
    held = [_big()]

    @jax.custom_jvp
    def g(x):
        return jnp.sin(x)

    g.defjvp(lambda p, t: (g(p[0]), jax.jit(lambda v: v * jnp.asarray(held[0])[:3])(jnp.cos(p[0]) * t[0])))
    test_frule(g, X)
    held[0] = _big(1.01)
    with pytest.raises(AssertionError, match="tangent does not match finite differences"):
        test_frule(g, X)


def test_constants_are_found_in_nested_jaxprs_once_each():
    """`_compiled._constants`: the program's own and each nested jaxpr's, a shared one once."""
    from rules.testing import _compiled

    a, b = jnp.asarray(_big()), jnp.asarray(_big(2.0))

    def program(x):
        inner = jax.jit(lambda v: v * a[:3] + b[:3])
        return inner(x) * a[:3] + jax.lax.cond(x[0] > 0, lambda v: v * b[:3], lambda v: v, x)

    found = _compiled._constants(jax.jit(program).trace(X).jaxpr)
    assert sorted(id(c) for c in found) == sorted({id(a), id(b)})


def test_programs_that_call_back_into_python_are_recognised_and_never_reused():
    """Canary: the lowered text of every kind of host callback carries one of the marks that
    keep a program from being reused (it names the mechanism, not the Python function), on
    this JAX and backend; a plain program carries none."""
    from jax.experimental import io_callback

    from rules.testing import _compiled

    spec = jax.ShapeDtypeStruct((3,), jnp.float32)
    programs = {
        "pure_callback": lambda x: jax.pure_callback(np.sin, spec, x),
        "io_callback": lambda x: io_callback(np.sin, spec, x),
        "debug.callback": lambda x: (jax.debug.callback(lambda v: None, x), x)[1],
    }
    x = jnp.ones(3, jnp.float32)
    for name, program in programs.items():
        assert _compiled.holds_host_callback(jax.jit(program).lower(x).as_text()), name
    assert not _compiled.holds_host_callback(jax.jit(jnp.sin).lower(x).as_text())
    before = _compiled.stats["compiled"]
    for _ in range(2):
        np.testing.assert_allclose(_compiled.run(programs["pure_callback"], x), np.sin(1.0), rtol=1e-6)
    assert _compiled.stats["compiled"] == before + 2  # compiled for each trace
