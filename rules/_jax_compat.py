"""Every private or version-dependent JAX name the project uses: the probes and the fallbacks.

JAX changes its internals between releases (jax 0.11.1 changed what a primitive's
linearization returns; 0.11.0 made `ClosedJaxpr` and `Jaxpr` one class). Everything the
project needs beyond JAX's public API is imported here, behind a probe of what the installed
JAX does, never a comparison of version strings; other modules import it from here.

* `DUAL`: why the dual-mode lowering (`rules/_dual.py`) can run on this JAX, or None and
  `DUAL_MISSING` says why not. Its footing is the primitive interface JAX has kept for years,
  from `jax.interpreters` (semi-public): a JVP rule, a transpose rule and a batching rule
  per primitive (`primitive_jvps`, `primitive_transposes`, `fancy_primitive_batchers`).
* `unmapped_aval`: an aval with a batch axis added (JAX's own, for sharding in types).
* `LoweringContractError`: raised by `check_dual_lowering()` when the lowering's first
  use on this JAX does not give JAX's own answers, naming the JAX version and the way out
  (`ZYGOTE_JAX_LOWERING=custom_vjp`).
"""

from __future__ import annotations

import os
import types
from typing import Any

import jax

__all__ = [
    "DUAL",
    "DUAL_MISSING",
    "ENABLED",
    "JAX_VERSION",
    "varying_axes",
    "pcast_varying",
    "unmapped_aval",
]

JAX_VERSION = jax.__version__

# ----- the dual-mode lowering's footing -------------------------------------------------------
DUAL: Any = None
DUAL_MISSING = ""
try:
    from jax.extend.core import Primitive as _Primitive
    from jax.interpreters import ad as _ad
    from jax.interpreters import batching as _batching
    from jax.interpreters import mlir as _mlir
    from jax.interpreters import partial_eval as _pe

    _missing = [
        name
        for mod, name in [
            (_ad, "primitive_jvps"), (_ad, "primitive_transposes"), (_ad, "Zero"),
            (_ad, "is_undefined_primal"), (_batching, "fancy_primitive_batchers"),
            (_mlir, "lower_fun"), (_mlir, "register_lowering"), (_pe, "JaxprTracer"),
            (jax, "typeof"),
        ]
        if not hasattr(mod, name)
    ]
    if _missing:
        DUAL_MISSING = f"jax {JAX_VERSION} lacks {', '.join(_missing)}"
    else:

        DUAL = types.SimpleNamespace(  # the names `_dual` binds to
            Primitive=_Primitive,
            Zero=_ad.Zero,
            primitive_jvps=_ad.primitive_jvps,
            primitive_transposes=_ad.primitive_transposes,
            is_undefined_primal=_ad.is_undefined_primal,
            fancy_primitive_batchers=_batching.fancy_primitive_batchers,
            lower_fun=_mlir.lower_fun,
            register_lowering=_mlir.register_lowering,
            PartialEvalTracer=_pe.JaxprTracer,
        )

except ImportError as err:  # pragma: no cover - an older or reorganised JAX
    DUAL_MISSING = f"jax {JAX_VERSION}: {err}"

# `ZYGOTE_JAX_LOWERING=custom_vjp` forces the fallback (to compare, or to work around a JAX bug).
ENABLED = DUAL is not None and os.environ.get("ZYGOTE_JAX_LOWERING", "dual") != "custom_vjp"


# ----- batching: an aval with a batch axis ----------------------------------------------------
def _unmapped_aval_by_hand(size: int, axis: int, aval: Any, explicit_mesh_axis: Any = None) -> Any:
    """Fallback: the aval with a leading axis of `size` (no sharding in types)."""
    shape = (*aval.shape[:axis], size, *aval.shape[axis:])
    return jax.core.ShapedArray(shape, aval.dtype, weak_type=aval.weak_type)


try:
    from jax._src.core import unmapped_aval as _jax_unmapped_aval

    def unmapped_aval(size: int, axis: int, aval: Any, explicit_mesh_axis: Any = None) -> Any:
        return _jax_unmapped_aval(size, axis, aval, explicit_mesh_axis)

except ImportError:  # pragma: no cover - JAX moved it
    unmapped_aval = _unmapped_aval_by_hand


# ----- shard_map's varying axes ---------------------------------------------------------------
def varying_axes(x: Any) -> tuple:
    """The mesh axes along which `x` varies inside `shard_map` (empty elsewhere)."""
    aval = jax.typeof(x)
    axes = getattr(aval, "vma", None)  # JAX 0.6 - 0.9
    if axes is None:
        axes = getattr(getattr(aval, "mat", None), "varying", None)  # JAX 0.10+: ManualAxisType
    return tuple(sorted(axes)) if axes else ()


def pcast_varying(x: Any, axes: tuple) -> Any:
    if hasattr(jax.lax, "pcast"):  # JAX >= 0.8
        return jax.lax.pcast(x, axes, to="varying")
    return jax.lax.pvary(x, axes)  # pragma: no cover - JAX 0.6 - 0.7
