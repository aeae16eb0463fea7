"""`jax.scipy.special`, with the library's rules where they are right and JAX is not.

`from rules.library.jax.scipy import special` for `from jax.scipy import special`. The names
in `SHADOWED` are the library's, with JAX's signatures; `EXTRA` are SciPy functions JAX does
not have (`kv`, `iv`, `jv`, `yv`, `struve` from `rules.library.special`, `exprel` from
`rules.library.logexp`); every other name is JAX's object. Where JAX has `iv` (0.12.1 on, of
a static integer order only), `iv` is shadowed: JAX's own at a Python or NumPy integer order,
the library's at any other (a float order, a traced one).

>>> import jax
>>> from rules.library.jax.scipy import special
>>> float(jax.grad(special.xlogy, argnums=1)(0.0, 0.0))   # JAX: NaN
0.0
"""

from __future__ import annotations

import jax.numpy as _jnp
import jax.scipy.special as _jsp
import numpy as _np

from ... import elementwise as _elementwise  # noqa: F401  (registers the rules used below)
from ... import logexp as _logexp
from ... import special as _special
from ... import special_jax as _special_jax  # registers the rules used below
from ...._primitive import primitive as _primitive
from .._shadow import fallback as _fallback

expit = _primitive(_jsp.expit)  # s(x) s(-x): float32 tails
xlogy = _logexp.xlogy  # d/dy = 0 where x = 0 (JAX: NaN at (0, 0))
xlog1py = _logexp.xlog1py
betainc = _primitive(_jsp.betainc)  # d/dx at x = 0 (a = 1) and x = 1 (b = 1) (JAX: NaN)
betaln = _special_jax._betaln  # by digamma (JAX 0.10: wrong second derivatives where a = b)
gammainc = _primitive(_jsp.gammainc)  # d/dx at x = 0, a = 1 (JAX: NaN)
gammaincc = _primitive(_jsp.gammaincc)
i0, i0e, i1, i1e = (_primitive(f) for f in (_jsp.i0, _jsp.i0e, _jsp.i1, _jsp.i1e))  # tiny and huge x
logsumexp = _logexp.logsumexp  # d/db where b = 0 (JAX: 0)

# SciPy's, which JAX lacks (Bessel and Struve by host calls: rules.library.special)
kv, kve, ive, jv, yv, struve = (_special.kv, _special.kve, _special.ive, _special.jv, _special.yv,
                                _special.struve)  # fmt: skip
exprel = _logexp.exprel  # expm1(x) / x, 1 at 0, with its slope 1/2 there
_JAX_IV = getattr(_jsp, "iv", None)  # jax >= 0.12.1: of a static integer order only


def iv(v, z):
    """The modified Bessel function of the first kind, I_v(z): JAX's own
    `jax.scipy.special.iv` (where it exists) at a Python or NumPy integer order `v`, which it
    computes natively, for complex `z` too; `rules.library.special.iv` at any other order
    (a float, a traced or batched one), which JAX's raises for.

    >>> float(iv(2.5, 1.0)) == float(_special.iv(2.5, 1.0))
    True
    """
    if _JAX_IV is not None and isinstance(v, (int, _np.integer)):
        return _JAX_IV(v, z)
    return _special.iv(v, z)


def beta(a, b):
    """The Beta function, JAX's `jax.scipy.special.beta` (its values, sign and dtype) with
    log B(a, b) by `betaln`'s rule: its derivatives are digammas (JAX 0.10's second
    derivatives are wrong where a = b).

    >>> import jax
    >>> round(float(jax.grad(jax.grad(beta))(1.0, 1.0)), 12)  # B(a, 1) = 1/a: 2/a^3
    2.0
    """
    dtype = _jnp.result_type(float, a, b)
    if _jnp.issubdtype(dtype, _jnp.complexfloating):
        return _jsp.beta(a, b)  # JAX's error for complex arguments
    a, b = _jnp.asarray(a, dtype), _jnp.asarray(b, dtype)
    return _jsp.gammasgn(a) * _jsp.gammasgn(b) * _jsp.gammasgn(a + b) * _jnp.exp(betaln(a, b))


SHADOWED: tuple[str, ...] = ("expit", "xlogy", "xlog1py", "betainc", "betaln", "beta", "gammainc", "gammaincc", "i0",
                             "i0e", "i1", "i1e", "logsumexp") + (("iv",) if _JAX_IV is not None else ())
EXTRA = ("kv", "kve", "ive", "jv", "yv", "struve", "exprel") + (() if _JAX_IV is not None else ("iv",))

__getattr__, __dir__ = _fallback(__name__, _jsp, SHADOWED + EXTRA)
