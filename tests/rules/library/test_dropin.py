"""rules.library.jax: drop-in namespaces shaped like JAX's, whose functions use the library's rules.

Every shadowed name keeps JAX's signature and values; every other name is JAX's object;
through the namespace, jax.grad / zygote_jax.gradient give the library's derivatives."""

import functools
import inspect

import jax
import jax.numpy
import jax.scipy.special
import jax.scipy.stats
import numpy as np
import pytest

import rules
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


def _functions(ours, theirs, prefix):
    """(our function, JAX's, its dotted name) for every shadowed function, into sub-namespaces."""
    for name in ours.SHADOWED:
        mine, jaxs = getattr(ours, name), getattr(theirs, name)
        if inspect.ismodule(jaxs):  # jax.numpy.linalg, jax.scipy.stats.gamma: their own SHADOWED
            yield from _functions(mine, jaxs, f"{prefix}{name}.")
        else:
            yield mine, jaxs, f"{prefix}{name}"


FUNCTIONS = [f for ours, theirs in MODULES for f in _functions(ours, theirs, f"{theirs.__name__}.")]


def _parameters(f):
    return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]


@pytest.mark.parametrize("mine, jaxs, name", FUNCTIONS, ids=[name for _, _, name in FUNCTIONS])
def test_every_shadowed_name_keeps_jax_signature(mine, jaxs, name):
    assert mine is not jaxs
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
    "betainc": (_X + 0.5, 2.0, _X / 3),
    "betaln": (_X + 0.5, _X[::-1]),
    "beta": (_X + 0.5, _X[::-1] - 1.2),  # a negative b too: the sign of B
    "gammainc": (_X + 0.5, _X),
    "gammaincc": (_X + 0.5, _X),
    "logsumexp": (np.array([[0.5, -1.0, 2.0], [1.0, 0.2, -0.3]]),),
    "polar": (_M,),
    "iv": (2, _X),  # jax >= 0.12.1: of a static integer order (STATIC)
    # jax.scipy.stats, as "distribution.function"
    "gamma.logpdf": (_X, 1.5), "gamma.pdf": (_X, 1.5),
    "chi2.logpdf": (_X, 3.0), "chi2.pdf": (_X, 3.0),
    "beta.logpdf": (_X / 3, 2.0, 1.5), "beta.pdf": (_X / 3, 2.0, 1.5),
    "poisson.logpmf": (np.array([0.0, 1.0, 4.0]), 1.3), "poisson.pmf": (np.array([0.0, 1.0, 4.0]), 1.3),
    "binom.logpmf": (np.array([0.0, 1.0, 4.0]), 5.0, 0.3), "binom.pmf": (np.array([0.0, 1.0, 4.0]), 5.0, 0.3),
    "bernoulli.logpmf": (np.array([0.0, 1.0, 1.0]), 0.3), "bernoulli.pmf": (np.array([0.0, 1.0, 1.0]), 0.3),
    "geom.logpmf": (np.array([1.0, 2.0, 4.0]), 0.3), "geom.pmf": (np.array([1.0, 2.0, 4.0]), 0.3),
    "nbinom.logpmf": (np.array([0.0, 1.0, 4.0]), 3.0, 0.4), "nbinom.pmf": (np.array([0.0, 1.0, 4.0]), 3.0, 0.4),
    "betabinom.logpmf": (np.array([0.0, 1.0, 3.0]), 3.0, 2.0, 1.5),
    "betabinom.pmf": (np.array([0.0, 1.0, 3.0]), 3.0, 2.0, 1.5),
    "multinomial.logpmf": (np.array([1, 0, 2]), 3, np.array([0.2, 0.3, 0.5])),
    "multinomial.pmf": (np.array([1, 0, 2]), 3, np.array([0.2, 0.3, 0.5])),
    "truncnorm.logpdf": (_X - 1, -0.5, 2.0), "truncnorm.pdf": (_X - 1, -0.5, 2.0),
    "truncnorm.logcdf": (_X - 1, -0.5, 2.0), "truncnorm.cdf": (_X - 1, -0.5, 2.0),
}  # fmt: skip
STATIC = {"iv": (0,)}  # arguments JAX's function takes static only (jax.jit's static_argnums)


@pytest.mark.parametrize("mine, jaxs, name", FUNCTIONS, ids=[name for _, _, name in FUNCTIONS])
def test_every_shadowed_name_keeps_jax_values(mine, jaxs, name):
    parts = name.split(".")  # SAMPLES by "distribution.function", else by the function's name
    args = SAMPLES.get(".".join(parts[-2:]), SAMPLES.get(parts[-1], (_X - 1,)))
    jit = functools.partial(jax.jit, static_argnums=STATIC.get(parts[-1], ()))
    expected = jit(jaxs)(*args)  # JAX's values, compiled (op by op they compile each operation)
    for got in (mine(*args), jit(mine)(*args)):  # ours eagerly and compiled
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)


def test_iv_is_jax_own_at_an_integer_order_and_the_librarys_at_any_other():
    """JAX 0.12.1 added `jax.scipy.special.iv` of a static integer order: the namespace's `iv`
    gives JAX's there (complex z too) and the library's at a float or traced order, both
    SciPy's values, with the same derivative in z at an integer order."""
    import scipy.special

    from rules.library import special

    x = np.array([0.3, 1.7, 25.0])
    np.testing.assert_allclose(rsp.iv(2.5, x), scipy.special.iv(2.5, x), rtol=1e-12)
    np.testing.assert_allclose(jax.jit(rsp.iv)(2, x), scipy.special.iv(2, x), rtol=1e-12)  # traced order
    slopes = [jax.vmap(jax.grad(lambda t, f=f: f(2, t)))(x) for f in (rsp.iv, special.iv)]
    np.testing.assert_allclose(slopes[0], slopes[1], rtol=1e-12)
    if not hasattr(jax.scipy.special, "iv"):  # jax < 0.12.1: the library's at every order
        assert "iv" in rsp.EXTRA and "iv" not in rsp.SHADOWED
        return
    assert "iv" in rsp.SHADOWED and "iv" not in rsp.EXTRA
    z = np.array([1.0 + 1.0j, -0.5 + 2.0j])
    np.testing.assert_allclose(rsp.iv(2, z), scipy.special.iv(2, z), rtol=1e-12)  # JAX's: complex too
    with pytest.raises(TypeError):  # JAX's own refuses a float order
        jax.scipy.special.iv(2.5, x)


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
    (lambda x: rsp.betainc(1.0, 2.0, x), (0.0,), (2.0,)),  # x^(a-1) (1-x)^(b-1) / B(a, b) = b at x = 0
    (lambda x: rsp.gammainc(1.0, x), (0.0,), (1.0,)),  # x^(a-1) e^-x / Gamma(a) = 1
    (rsp.i0, (1e-300,), (5e-301,)),  # i1(x) ~ x / 2
    (lambda b: rsp.logsumexp(np.zeros(3), b=b), (np.array([1.0, 1.0, 0.0]),), (0.5, 0.5, 0.5)),  # exp(a_i - y)
    (lambda b: rnn.logsumexp(np.zeros(3), b=b), (np.array([1.0, 1.0, 0.0]),), (0.5, 0.5, 0.5)),
    (lambda x: rst.gamma.logpdf(x, 1.0, 0.0, 2.0), (0.0,), (-0.5,)),  # -1/scale at x = 0 for a = 1
    (lambda mu: rst.poisson.logpmf(0.0, mu), (0.0,), (-1.0,)),  # log P(0) = -mu
    (lambda p: rst.binom.logpmf(0.0, 3.0, p), (0.0,), (-3.0,)),  # n log(1 - p)
    (lambda p: rst.bernoulli.logpmf(1.0, p), (1.0,), (1.0,)),  # log p
    (lambda p: rst.geom.logpmf(1.0, p), (1.0,), (1.0,)),  # log p
    (lambda x: rst.beta.logpdf(x, 1.0, 2.0), (0.0,), (-1.0,)),  # log 2 + log(1 - x)
    (lambda x: rst.chi2.logpdf(x, 2.0), (0.0,), (-0.5,)),  # -x / 2 - log 2
    # polar(I + t E) = (expm of the skew part of t E) (I + sym part): d u[0, 1] / d a = (E01 - E10) / 2
    (lambda a: rsl.polar(a)[0][0, 1], (np.eye(2),), (0.0, 0.5, -0.5, 0.0)),
]


@pytest.mark.parametrize("f, args, true", THROUGH_THE_NAMESPACE, ids=[f"{k}-{getattr(f, '__name__', 'f')}" for k, (f, _, _) in enumerate(THROUGH_THE_NAMESPACE)])
def test_jax_grad_through_the_namespace_gives_the_library_value(f, args, true):
    argnums = tuple(range(len(args)))
    rtol = 1e-5 if np.result_type(*args) == np.float32 else 1e-12
    for grads in (jax.grad(f, argnums=argnums)(*args), jax.jit(jax.grad(f, argnums=argnums))(*args)):
        got = np.concatenate([np.ravel(g) for g in grads]).astype(np.float64)
        np.testing.assert_allclose(got, np.array(true, np.float64), rtol=rtol, atol=0)


# (drop-in, JAX's function, its optional parameter by keyword, an edge x, the library's slope there):
# every shadowed scalar_rule function with an optional parameter
BY_KEYWORD = [
    (rnn.elu, jax.nn.elu, {"alpha": 2.0}, -40.0, 2 * np.exp(-40.0)),  # alpha exp(x) (JAX 0.10: 0)
    (rnn.celu, jax.nn.celu, {"alpha": 0.5}, -20.0, np.exp(-40.0)),  # exp(x / alpha)
    (rnn.squareplus, jax.nn.squareplus, {"b": 3.0}, np.float32(1e20), 1.0),  # (JAX < 0.12.1: 1/2)
]


@pytest.mark.parametrize("mine, jaxs, kw, edge, slope", BY_KEYWORD, ids=[f.__name__ for f, *_ in BY_KEYWORD])
def test_a_parameter_by_keyword_is_bound_to_its_place_under_grad_and_jit(mine, jaxs, kw, edge, slope, maybe_jit):
    x = np.array([-1.3, 0.4, 2.0])
    (value,) = kw.values()
    np.testing.assert_allclose(maybe_jit(lambda x: mine(x, **kw))(x), jaxs(x, **kw), rtol=1e-12)
    for d in (jax.grad, jax.jacfwd):  # reverse and forward mode: JAX's slope at ordinary points
        np.testing.assert_allclose(maybe_jit(d(lambda x: jax.numpy.sum(mine(x, **kw))))(x),
                                   d(lambda x: jax.numpy.sum(jaxs(x, value)))(x), rtol=1e-12)
    rtol = 1e-6 if np.result_type(edge) == np.float32 else 1e-12
    assert float(maybe_jit(jax.grad(lambda x: mine(x, **kw)))(edge)) == pytest.approx(slope, rel=rtol, abs=0)
    assert float(maybe_jit(jax.grad(lambda x: mine(x, value)))(edge)) == pytest.approx(slope, rel=rtol, abs=0)
    _, back = rules.rrule(mine, x, **kw)  # the rule itself: one cotangent per positional argument
    assert len(back(np.ones(3))) == 2


def test_a_keyword_only_argument_at_its_default_is_dropped():
    # jnp's ufuncs take `out=None, where=None` by keyword only: passed as given, they change nothing
    g = jax.grad(lambda a, b: rnp.logaddexp(a, b, where=None), argnums=(0, 1))(0.3, 0.5)
    np.testing.assert_allclose(g, jax.grad(jax.numpy.logaddexp, argnums=(0, 1))(0.3, 0.5), rtol=1e-14)


def test_zygote_gradient_through_the_namespace_uses_the_rules():
    assert zygote_jax.gradient(rnp.hypot, 0.0, 0.0) == (0.0, 0.0)
    assert zygote_jax.gradient(jax.numpy.hypot, 3.0, 4.0)[0] == pytest.approx(0.6)
    (g,) = zygote_jax.gradient(lambda x: rnp.vander(x).sum(), np.array([0.0, 2.0]))
    np.testing.assert_allclose(g, [1.0, 1.0])  # x**0 contributes 0 at x = 0 (JAX: NaN)


def test_vander_hessian_is_finite_at_zero():
    # sum(vander(x, 3)) = sum(x**2 + x + 1): the Hessian is 2 I; JAX's pow: a NaN row at x = 0
    x = np.array([0.0, 1.0])
    for hessian in (jax.hessian, lambda f: jax.jacrev(jax.jacrev(f)), lambda f: jax.jacfwd(jax.jacfwd(f))):
        for h in (hessian(lambda x: rnp.vander(x, 3).sum())(x), jax.jit(hessian(lambda x: rnp.vander(x, 3).sum()))(x)):
            np.testing.assert_array_equal(h, 2 * np.eye(2))


def test_linalg_norm_reads_a_float_ord_of_a_matrix_norm_statically_as_jax_does():
    # np.inf is a Python float: the library's norm traces floats as a differentiable p, which
    # only vector norms have; the drop-in reads a matrix norm's float ord as JAX does
    m, v = _M, _X
    for ord in (np.inf, -np.inf, 1.0, 2.0, -2.0):
        np.testing.assert_allclose(jax.jit(lambda m: rlinalg.norm(m, ord))(m), jax.numpy.linalg.norm(m, ord), rtol=1e-12)
        np.testing.assert_allclose(jax.grad(lambda m: rlinalg.norm(m, ord))(m),
                                   jax.grad(lambda m: jax.numpy.linalg.norm(m, ord))(m), rtol=1e-9, atol=1e-12)
    for ord in (np.inf, 3.0, 0.5):  # vector norms: the same values and gradients
        np.testing.assert_allclose(jax.jit(lambda v: rlinalg.norm(v, ord))(v), jax.numpy.linalg.norm(v, ord), rtol=1e-12)
        np.testing.assert_allclose(jax.grad(lambda v: rlinalg.norm(v, ord))(v),
                                   jax.grad(lambda v: jax.numpy.linalg.norm(v, ord))(v), rtol=1e-12)


def test_beta_has_the_true_hessian_where_jax_010s_is_wrong(jax_010):
    """B(a, b) = exp(betaln(a, b)) by betaln's rule; at (1, 1): d2/da2 = 2, d2/da db = 2 - pi^2/6
    (B (d_a log B d_b log B + d_ab log B), d_a log B = psi(1) - psi(2) = -1). JAX 0.10's own
    second derivatives there are wrong (its betaln's series)."""
    true = np.array([[2.0, 2 - np.pi**2 / 6], [2 - np.pi**2 / 6, 2.0]])
    for hessian in (jax.hessian(rsp.beta, (0, 1)), jax.jit(jax.hessian(rsp.beta, (0, 1)))):
        np.testing.assert_allclose(np.array(hessian(1.0, 1.0)), true, rtol=1e-12)
    jaxs = np.array(jax.hessian(jax.scipy.special.beta, (0, 1))(1.0, 1.0))
    assert np.allclose(jaxs, true, rtol=1e-6) == (not jax_010)
