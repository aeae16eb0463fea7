"""`jax.scipy.special`, with the library's rules where they are right and JAX is not.

`from rules.library.jax.scipy import special` for `from jax.scipy import special`. The names
in `SHADOWED` are the library's, with JAX's signatures; `EXTRA` are SciPy functions JAX does
not have (`kv`, `iv`, `jv`, `yv`, `struve` from `rules.library.special`, `exprel` from
`rules.library.logexp`); every other name is JAX's object.

>>> import jax
>>> from rules.library.jax.scipy import special
>>> float(jax.grad(special.xlogy, argnums=1)(0.0, 0.0))   # JAX: NaN
0.0
"""

from __future__ import annotations

import jax.scipy.special as _jsp

from ... import elementwise as _elementwise  # noqa: F401  (registers the rules used below)
from ... import logexp as _logexp
from ... import special as _special
from ... import special_jax as _special_jax  # noqa: F401  (registers the rules used below)
from ...._primitive import primitive as _primitive
from .._shadow import fallback as _fallback

expit = _primitive(_jsp.expit)  # s(x) s(-x): float32 tails
xlogy = _logexp.xlogy  # d/dy = 0 where x = 0 (JAX: NaN at (0, 0))
xlog1py = _logexp.xlog1py
betainc = _primitive(_jsp.betainc)  # d/dx at x = 0 (a = 1) and x = 1 (b = 1) (JAX: NaN)
gammainc = _primitive(_jsp.gammainc)  # d/dx at x = 0, a = 1 (JAX: NaN)
gammaincc = _primitive(_jsp.gammaincc)
i0, i0e, i1, i1e = (_primitive(f) for f in (_jsp.i0, _jsp.i0e, _jsp.i1, _jsp.i1e))  # tiny and huge x
logsumexp = _logexp.logsumexp  # d/db where b = 0 (JAX: 0)

# SciPy's, which JAX lacks (Bessel and Struve by host calls: rules.library.special)
kv, kve, iv, ive, jv, yv, struve = (_special.kv, _special.kve, _special.iv, _special.ive,
                                    _special.jv, _special.yv, _special.struve)  # fmt: skip
exprel = _logexp.exprel  # expm1(x) / x, 1 at 0, with its slope 1/2 there

SHADOWED = ("expit", "xlogy", "xlog1py", "betainc", "gammainc", "gammaincc", "i0", "i0e", "i1", "i1e", "logsumexp")
EXTRA = ("kv", "kve", "iv", "ive", "jv", "yv", "struve", "exprel")

__getattr__, __dir__ = _fallback(__name__, _jsp, SHADOWED + EXTRA)
