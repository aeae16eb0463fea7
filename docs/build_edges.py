"""The before/after table of edge gradients: plain JAX against `rules.library.jax`.

Each row is a function at an input where plain JAX's gradient is NaN, infinite or wrong, the
gradient `jax.jit(jax.grad(f))` gives through the drop-in namespace (same call, one import
changed), and the true one (closed form; the derivation is in the row's note). The table
goes into README.md between the `edge-table` markers; the plain-JAX column depends on the
JAX release (and may differ op by op: `special.i1(800.)`'s is -inf compiled, NaN eagerly, on
jax 0.12.1), the other two do not, and `--check` fails when the library's column is not the
true one.

    python docs/build_edges.py            # print the table
    python docs/build_edges.py --readme   # rewrite README.md's table
    python docs/build_edges.py --check    # exit 1 if any library gradient is not the true one
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
from typing import Any, Callable, NamedTuple

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy  # noqa: E402
import jax.scipy.special  # noqa: E402
import jax.scipy.stats  # noqa: E402
import numpy as np  # noqa: E402

import rules.library.jax.numpy as rnp  # noqa: E402
from rules.library.jax import nn as rnn  # noqa: E402
from rules.library.jax.scipy import linalg as rsl  # noqa: E402
from rules.library.jax.scipy import special as rsp  # noqa: E402
from rules.library.jax.scipy import stats as rst  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- edge-table: begin (python docs/build_edges.py --readme) -->", "<!-- edge-table: end -->"


class Edge(NamedTuple):
    call: str  # as a user writes it, with `jnp` / `nn` / `special` / `stats` the module
    plain: Callable  # the function through JAX's module
    ours: Callable  # the same through rules.library.jax
    args: tuple
    argnum: int  # the argument differentiated
    true: float
    note: str
    entry: int = 0  # which entry of the gradient (of an array argument) the row shows


def _f32(x: float) -> Any:
    return np.float32(x)


EDGES = [
    Edge("jnp.hypot(0., 0.)", jax.numpy.hypot, rnp.hypot, (0.0, 0.0), 0, 0.0, "zero subgradient"),
    Edge("jnp.linalg.norm([3e-170, 4e-170]) d/dx0", jax.numpy.linalg.norm, rnp.linalg.norm,
         (np.array([3e-170, 4e-170]),), 0, 0.6, "x / norm(x); the squares underflow"),
    Edge("jnp.linalg.norm(f32 [3e20, 4e20]) d/dx0", jax.numpy.linalg.norm, rnp.linalg.norm,
         (np.array([3e20, 4e20], np.float32),), 0, 0.6, "the squares overflow"),
    Edge("jnp.abs(0.)", jax.numpy.abs, rnp.abs, (0.0,), 0, 0.0, "ChainRules' zero subgradient, sign(0)"),
    Edge("jnp.power(0., 0.)", jax.numpy.power, rnp.power, (0.0, 0.0), 0, 0.0, "ChainRules: 0 p x^(p-1) at p = 0"),
    Edge("jnp.vander([0., 2.]).sum() d/dx0", lambda x: jax.numpy.vander(x).sum(), lambda x: rnp.vander(x).sum(),
         (np.array([0.0, 2.0]),), 0, 1.0, "d/dx0 of x0 + 1 + x1 + 1 (through x**0)"),
    Edge("jnp.expm1(-40.)", jax.numpy.expm1, rnp.expm1, (-40.0,), 0, math.exp(-40.0), "exp(x)"),
    Edge("jnp.sinc(1e-8)", jax.numpy.sinc, rnp.sinc, (1e-8,), 0, -(math.pi**2) * 1e-8 / 3, "-pi^2 x / 3 + O(x^3)"),
    Edge("jnp.arcsinh(1e200)", jax.numpy.arcsinh, rnp.arcsinh, (1e200,), 0, 1e-200, "1 / sqrt(x^2 + 1)"),
    Edge("jnp.arccosh(1e200)", jax.numpy.arccosh, rnp.arccosh, (1e200,), 0, 1e-200, "1 / sqrt(x^2 - 1)"),
    Edge("jnp.arctan2(1e-200, 1e-200)", jax.numpy.arctan2, rnp.arctan2, (1e-200, 1e-200), 0, 0.5e200, "b / (a^2 + b^2)"),
    Edge("jnp.logaddexp(-inf, -inf)", jax.numpy.logaddexp, rnp.logaddexp, (-np.inf, -np.inf), 0, 0.0,
         "an empty sum (as logsumexp)"),
    Edge("jnp.logaddexp(f32 1e8, 1e8)", jax.numpy.logaddexp, rnp.logaddexp, (_f32(1e8), _f32(1e8)), 0, 0.5,
         "equal weights"),
    Edge("jnp.tanh(f32 -9.01)", jax.numpy.tanh, rnp.tanh, (_f32(-9.01),), 0, 1 / math.cosh(9.01) ** 2, "sech^2(x)"),
    Edge("nn.sigmoid(f32 17.)", jax.nn.sigmoid, rnn.sigmoid, (_f32(17.0),), 0,
         math.exp(-17.0) / (1 + math.exp(-17.0)) ** 2, "s(x) s(-x)"),
    Edge("nn.elu(-40.)", jax.nn.elu, rnn.elu, (-40.0,), 0, math.exp(-40.0), "alpha exp(x)"),
    Edge("nn.squareplus(f32 1e20)", jax.nn.squareplus, rnn.squareplus, (_f32(1e20),), 0, 1.0,
         "(1 + x / sqrt(x^2 + b)) / 2"),
    Edge("special.xlogy(0., 0.) d/dy", jax.scipy.special.xlogy, rsp.xlogy, (0.0, 0.0), 1, 0.0, "xlogy(0, y) = 0 for all y"),
    Edge("special.xlog1py(0., -1.) d/dy", jax.scipy.special.xlog1py, rsp.xlog1py, (0.0, -1.0), 1, 0.0,
         "xlog1py(0, y) = 0 for all y"),
    Edge("special.betainc(1., 2., 0.) d/dx", jax.scipy.special.betainc, rsp.betainc, (1.0, 2.0, 0.0), 2, 2.0,
         "x^(a-1) (1-x)^(b-1) / B(a, b)"),
    Edge("special.gammainc(1., 0.) d/dx", jax.scipy.special.gammainc, rsp.gammainc, (1.0, 0.0), 1, 1.0,
         "x^(a-1) e^-x / Gamma(a)"),
    Edge("special.i1(800.)", jax.scipy.special.i1, rsp.i1, (800.0,), 0, math.inf, "I0 - I1 / x, overflows to inf"),
    Edge("special.logsumexp(0, b=[0, 1, 1]) d/db0", lambda b: jax.scipy.special.logsumexp(np.zeros(3), b=b),
         lambda b: rsp.logsumexp(np.zeros(3), b=b), (np.array([0.0, 1.0, 1.0]),), 0, 0.5, "exp(a_0 - y)"),
    Edge("stats.gamma.logpdf(0., 1.) d/dx", jax.scipy.stats.gamma.logpdf, rst.gamma.logpdf, (0.0, 1.0), 0, -1.0,
         "the exponential density's -1/scale"),
    Edge("stats.beta.logpdf(0., 1., 2.) d/dx", jax.scipy.stats.beta.logpdf, rst.beta.logpdf, (0.0, 1.0, 2.0), 0, -1.0,
         "log 2 + log(1 - x)"),
    Edge("stats.poisson.logpmf(0, 0.) d/dmu", jax.scipy.stats.poisson.logpmf, rst.poisson.logpmf, (0.0, 0.0), 1,
         -1.0, "log P(0) = -mu"),
    Edge("stats.binom.logpmf(0, 3, 0.) d/dp", jax.scipy.stats.binom.logpmf, rst.binom.logpmf, (0.0, 3.0, 0.0), 2,
         -3.0, "n log(1 - p)"),
    Edge("stats.truncnorm.logpdf(10.5, 10, 11) d/da", jax.scipy.stats.truncnorm.logpdf, rst.truncnorm.logpdf,
         (10.5, 10.0, 11.0), 1, 10.098346447, "phi(a) / (Phi(b) - Phi(a))"),
    Edge("linalg.polar(I)[0][0, 1] d/da01", lambda a: jax.scipy.linalg.polar(a, method="svd")[0][0, 1],
         lambda a: rsl.polar(a)[0][0, 1], (np.eye(2),), 0, 0.5, "skew part of da: (da01 - da10) / 2", 1),
]  # fmt: skip


def _gradient(f: Callable, args: tuple, argnum: int, entry: int) -> float:
    """One entry of the gradient (the argument may be an array), compiled: one program per
    gradient, where op by op each operation compiles on its own (~4x the time in all)."""
    return float(np.ravel(jax.jit(jax.grad(f, argnums=argnum))(*args))[entry])


def _right(got: float, true: float) -> bool:
    if math.isnan(true) or math.isinf(true):
        return math.isnan(got) if math.isnan(true) else got == true
    return math.isclose(got, true, rel_tol=1e-5, abs_tol=0.0) if true != 0 else got == 0


def rows() -> list[tuple[Edge, float, float]]:
    """(edge, plain JAX's gradient, the library's gradient) for every edge."""
    return [(e, _gradient(e.plain, e.args, e.argnum, e.entry), _gradient(e.ours, e.args, e.argnum, e.entry)) for e in EDGES]


def wrong(computed: list[tuple[Edge, float, float]]) -> list[str]:
    """The edges of `computed` (`rows()`) where the library's gradient is not the true one."""
    return [e.call for e, _, ours in computed if not _right(ours, e.true)]


def table(computed: list[tuple[Edge, float, float]] | None = None) -> str:
    """The README's table, of `computed` (`rows()`, computed here if not given)."""
    lines = [
        f"| gradient of | plain JAX {jax.__version__} | `rules.library.jax` | true | why |",
        "|---|---|---|---|---|",
    ]
    for e, plain, ours in rows() if computed is None else computed:
        mark = "" if _right(plain, e.true) else " ✗"
        lines.append(f"| `{e.call}` | {plain:.4g}{mark} | {ours:.4g} | {e.true:.4g} | {e.note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's table")
    parser.add_argument("--check", action="store_true", help="exit 1 if a library gradient is not the true one")
    options = parser.parse_args(argv)
    computed = rows()  # once: 58 compiled gradients (seconds in all)
    failed = wrong(computed)
    if options.check:
        print("\n".join(f"not the true gradient: {call}" for call in failed) or f"{len(EDGES)} edges right")
        return 1 if failed else 0
    text = table(computed)
    if options.readme:
        readme = ROOT / "README.md"
        before, rest = readme.read_text().split(BEGIN)
        _, after = rest.split(END)
        readme.write_text(f"{before}{BEGIN}\n{text}\n{END}{after}")
    else:
        print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
