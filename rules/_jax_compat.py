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
* `linearize_contract`, `LINEARIZATIONS`: JAX's newer linearization rules, whose contract
  changed in jax 0.11.1; `_dual` adds one beside its JVP rule only where the contract is
  one it knows (for eager speed), and the JVP rule serves alone elsewhere.
* `outside_partial_eval`: where JAX linearizes by partially evaluating a JVP rule, the
  rrule's forward pass runs on the trace beneath (eagerly in an eager `jax.grad`), as JAX
  runs a `jax.custom_vjp`'s; without it (fallback) it runs through the partial evaluation,
  correct and about 1.5x slower eagerly.
* `concrete_value`: the concrete value behind a tracer of an eager transformation (a JVP
  tracer of a concrete primal), so that a primitive's output type can come from evaluating
  its function where an abstract trace cannot (a function that branches on its argument's
  value, as plain JAX allows eagerly). `Tracer.to_concrete_value`, private but in every JAX
  since 0.4.36; without it, None (the abstract trace's error stands).
* `LoweringContractError`: raised by `check_dual_lowering()` when the lowering's first
  use on this JAX does not give JAX's own answers, naming the JAX version and the way out
  (`ZYGOTE_JAX_LOWERING=custom_vjp`).
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any

import jax

__all__ = [
    "DUAL",
    "DUAL_MISSING",
    "ENABLED",
    "JAX_VERSION",
    "LINEARIZATIONS",
    "VALUE_DEPENDENT",
    "concrete_value",
    "fallback_linearize",
    "linearize_contract",
    "outside_partial_eval",
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


# ----- the optional linearization rule ---------------------------------------------------------
# JAX asks a primitive with a linearization rule for it when it linearizes (jax.grad, jax.vjp,
# jax.linearize), saying whether the result is only to be transposed (`is_vjp`); without
# one, it partially evaluates the JVP rule, which costs ~0.15 ms more per eager jax.grad.
# The interface is young and changed in jax 0.11.1, so it is used only where
# `linearize_contract()` recognises it, and only beside the JVP rule, which serves alone
# wherever it does not.
LINEARIZATIONS: Any = None  # JAX's table of linearization rules
fallback_linearize: Any = None  # JAX's own rule for a primitive without one: from the JVP rule
try:
    import inspect

    from jax._src.interpreters import ad as _ad_src

    if (
        DUAL is not None
        and "is_vjp" in inspect.signature(_ad_src.LinearizeTrace.__init__).parameters
        and hasattr(_ad_src, "primitive_linearizations")
        and hasattr(_ad_src, "fallback_linearize_rule")
    ):
        LINEARIZATIONS = _ad_src.primitive_linearizations
        fallback_linearize = _ad_src.fallback_linearize_rule
except (ImportError, AttributeError, TypeError, ValueError):  # pragma: no cover - JAX moved it
    pass


def linearize_contract() -> int:
    """How many values a linearization rule returns on this JAX: 4 (`primals_out, nzs_out,
    residuals, linearized`, up to jax 0.11.0) or 5 (structured residuals after the residuals,
    and `linearized(residuals, structured_residuals, *tangents)`, from jax 0.11.1), asked of
    JAX's own rule for `sin_p`, traced (nothing compiled); 0 where unknown."""
    if fallback_linearize is None:
        return 0
    got: list = []

    def probe(x):
        got.append(fallback_linearize(jax.lax.sin_p, True, [True], x, accuracy=None))
        return x

    try:
        jax.make_jaxpr(probe)(jax.ShapeDtypeStruct((), "float32"))
        n = len(got[0])
        last = got[0][-1]
        return n if n in (4, 5) and callable(last) and (n == 4 or got[0][3] is None) else 0
    except Exception:  # noqa: BLE001 - any surprise: the contract is not the one we know
        return 0


# ----- running a forward pass outside JAX's partial evaluation --------------------------------
def _no_escape(values: Any = ()) -> Any:
    """Fallback: stay on the current trace (correct; slower where it is a partial evaluation)."""
    return contextlib.nullcontext()


try:
    from jax._src import core as _core

    if not (hasattr(_core, "trace_ctx") and hasattr(_core, "set_current_trace") and DUAL is not None):
        raise ImportError("no trace context")

    def outside_partial_eval(values: Any = ()) -> Any:
        """A context in which JAX operations run on the trace that the current partial
        evaluation wraps, as JAX runs a `jax.custom_vjp`'s forward pass when it linearizes
        (eagerly, in an eager `jax.grad`); a null context elsewhere, or where any of `values`
        belongs to the partial evaluation itself."""
        trace = _core.trace_ctx.trace
        parent = getattr(trace, "parent_trace", None)
        if type(trace).__name__ != "JaxprTrace" or parent is None:
            return contextlib.nullcontext()
        if any(isinstance(v, DUAL.PartialEvalTracer) for v in values):
            return contextlib.nullcontext()
        return _core.set_current_trace(parent)

except ImportError:  # pragma: no cover - JAX reorganised its trace context
    outside_partial_eval = _no_escape


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


# ----- the concrete value behind an eager transformation's tracer -------------------------------
# What an abstract trace of a function that branches on its argument's value raises (public).
VALUE_DEPENDENT = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError,
)


def concrete_value(x: Any) -> Any:
    """`x` itself if it is not a tracer; the concrete value a tracer stands for (eager `jax.jvp`,
    `jax.grad` of concrete inputs); None when there is none (under `jit`) or this JAX cannot say."""
    if not isinstance(x, jax.core.Tracer):
        return x
    to_concrete = getattr(x, "to_concrete_value", None)
    return to_concrete() if to_concrete is not None else None
