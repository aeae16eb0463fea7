"""rules.library.jax: drop-in namespaces shaped like JAX's, whose functions use the library's rules.

Every shadowed name keeps JAX's signature and values; every other name is JAX's object;
through the namespace, jax.grad / zygote_jax.gradient give the library's derivatives."""

import inspect

import jax
import jax.numpy
import jax.scipy.special
import jax.scipy.stats
import numpy as np
import pytest

import rules.library.jax.numpy as rnp
import zygote_jax
from rules.library.jax import nn as rnn
from rules.library.jax.numpy import linalg as rlinalg
from rules.library.jax.scipy import linalg as rsl
from rules.library.jax.scipy import special as rsp
from rules.library.jax.scipy import stats as rst

MODULES = [
    (rnp, jax.numpy),
    (rlinalg, jax.numpy.linalg),
    (rnn, jax.nn),
    (rsp, jax.scipy.special),
    (rst, jax.scipy.stats),
    (rsl, jax.scipy.linalg),
]
_X = np.array([0.3, 1.7, 2.5])
_M = np.array([[2.0, 0.5, -0.3], [0.1, 1.5, 0.4], [-0.2, 0.3, 1.0]])


def _shadowed():
    for ours, theirs in MODULES:
        for name in ours.SHADOWED:
            yield pytest.param(ours, theirs, name, id=f"{theirs.__name__}.{name}")


def _parameters(f):
    return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]


@pytest.mark.parametrize("ours, theirs, name", list(_shadowed()))
def test_every_shadowed_name_keeps_jax_signature(ours, theirs, name):
    mine, jaxs = getattr(ours, name), getattr(theirs, name)
    assert mine is not jaxs
    if inspect.ismodule(jaxs):  # jax.numpy.linalg
        assert inspect.ismodule(mine)
        return
    assert _parameters(mine) == _parameters(jaxs)


# sample arguments for each shadowed function: JAX's values and ours agree there
SAMPLES = {
    "arccosh": (_X + 1,),
    "arctan2": (_X, _X[::-1]),
    "hypot": (_X, _X[::-1]),
    "power": (_X, _X[::-1]),
    "pow": (_X, _X[::-1]),
    "logaddexp": (_X, _X[::-1]),
    "logaddexp2": (_X, _X[::-1]),
    "vander": (_X,),
    "sign": (np.array([0.3 - 1j, -2.0 + 0.5j]),),
    "norm": (_M,),
    "det": (_M,),
    "inv": (_M,),
    "celu": (_X - 1, 0.7),
    "elu": (_X - 1, 0.7),
    "squareplus": (_X - 1, 2.0),
    "gelu": (_X - 1,),
    "xlogy": (np.array([0.0, 1.5, 2.0]), _X),
    "xlog1py": (np.array([0.0, 1.5, 2.0]), _X),
}


@pytest.mark.parametrize("ours, theirs, name", list(_shadowed()))
def test_every_shadowed_name_keeps_jax_values(ours, theirs, name):
    mine, jaxs = getattr(ours, name), getattr(theirs, name)
    if inspect.ismodule(jaxs):
        return
    args = SAMPLES.get(name, (_X - 1,))
    for got, expected in ((mine(*args), jaxs(*args)), (jax.jit(mine)(*args), jax.jit(jaxs)(*args))):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("ours, theirs", MODULES, ids=[t.__name__ for _, t in MODULES])
def test_every_other_name_is_jax_own(ours, theirs):
    public = [n for n in dir(theirs) if not n.startswith("_")]
    others = [n for n in public if n not in ours.SHADOWED]
    assert others and all(getattr(ours, n) is getattr(theirs, n) for n in others)
    assert set(public) <= set(dir(ours))
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        getattr(ours, "no_such_name")


def test_ufuncs_keep_their_methods():
    x = np.array([0.5, 1.0, 2.0])
    assert float(rnp.logaddexp.reduce(x)) == pytest.approx(float(jax.numpy.logaddexp.reduce(x)))
    assert rnp.logaddexp.nin == 2


# (namespace function, arguments, the true gradient): one per fixed case, through jax.grad
THROUGH_THE_NAMESPACE = [
    (rnp.hypot, (0.0, 0.0), (0.0, 0.0)),
    (rnp.abs, (0.0,), (0.0,)),
    (rnp.expm1, (-40.0,), (np.exp(-40.0),)),
    (rnp.power, (0.0, 0.0), (0.0, np.nan)),
    (rnp.arcsinh, (1e200,), (1e-200,)),
    (rnp.arctan2, (1e-200, 1e-200), (0.5e200, -0.5e200)),
    (rnp.logaddexp, (-np.inf, -np.inf), (0.0, 0.0)),
    (rnp.sinc, (1e-8,), (-(np.pi**2) * 1e-8 / 3,)),
    (rnn.sigmoid, (np.float32(17.0),), (np.float32(np.exp(-17.0)),)),
    (rnn.elu, (-40.0,), (np.exp(-40.0),)),
    (rnn.squareplus, (np.float32(1e20),), (1.0,)),
    (rsp.xlogy, (0.0, 0.0), (-np.inf, 0.0)),
    (rsp.xlog1py, (0.0, -1.0), (-np.inf, 0.0)),
]


@pytest.mark.parametrize("f, args, true", THROUGH_THE_NAMESPACE, ids=[f"{f.__name__}{a}" for f, a, _ in THROUGH_THE_NAMESPACE])
def test_jax_grad_through_the_namespace_gives_the_library_value(f, args, true):
    argnums = tuple(range(len(args)))
    rtol = 1e-5 if np.result_type(*args) == np.float32 else 1e-12
    for grads in (jax.grad(f, argnums=argnums)(*args), jax.jit(jax.grad(f, argnums=argnums))(*args)):
        np.testing.assert_allclose(np.array(grads, np.float64), np.array(true, np.float64), rtol=rtol, atol=0)


def test_zygote_gradient_through_the_namespace_uses_the_rules():
    assert zygote_jax.gradient(rnp.hypot, 0.0, 0.0) == (0.0, 0.0)
    assert zygote_jax.gradient(jax.numpy.hypot, 3.0, 4.0)[0] == pytest.approx(0.6)
    (g,) = zygote_jax.gradient(lambda x: rnp.vander(x).sum(), np.array([0.0, 2.0]))
    np.testing.assert_allclose(g, [1.0, 1.0])  # x**0 contributes 0 at x = 0 (JAX: NaN)
