"""Strict configuration for the whole test run (tests/ and the doctests in the packages).

x64 is on, so finite differences run in float64 and dtype-specific tests state their dtype;
implicit rank promotion raises, as it hides broadcasting bugs in rules.

The run is the same on any machine and under pytest-xdist:
- 8 CPU devices exist next to whatever accelerator there is; mesh tests build their mesh from
  `jax.devices("cpu")` and place their inputs on it, since `jax.devices()` may be one GPU.
- float32 matmuls (dot_general: `@`, einsum, and the products inside linalg rules; conv)
  run at full float32 precision. GPUs default to TF32 (~1e-3 relative error), too coarse for
  float32 comparisons against float64 or NumPy references (the testers' rtol is 1e-4); CPUs
  are at full precision anyway, so this changes nothing there. Set through the
  environment too, so subprocesses (notebook kernels, `python -m rules check`, benchmarks)
  inherit it; `JAX_DEFAULT_MATMUL_PRECISION=default pytest` runs the suite at the backend's
  own default.
- XLA:CPU generates the code of fused element-wise loops with its elemental emitter
  (`--xla_cpu_use_fusion_emitters=false` in `XLA_FLAGS`), not its newer fusion emitters,
  which take about twice as long to compile the suite's thousands of small programs
  (`benchmarks/suite.py`). The emitted code computes the same operations, with LLVM's usual
  optimization (FMA contraction included): element-wise functions give the same bits as
  with the default (`tests/test_conftest.py` compares ten of them, fused and alone, in
  float32 and float64). Set in the environment, so subprocesses inherit it; only when this
  jaxlib knows the flag (XLA aborts on an unknown one), which a 0.3 s subprocess asks once;
  left alone when `XLA_FLAGS` names it already, so
  `XLA_FLAGS=--xla_cpu_use_fusion_emitters=true pytest` runs the suite with XLA's default.
  The testers compile their own small check programs this way anyway (`_compiled.py`).
- pytest-benchmark, when installed (the suite does not use it), is turned off: under xdist
  it warns at start-up, and warnings are errors here.
"""

import os
import subprocess
import sys

os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

_QUICK_CPU_CODEGEN = "--xla_cpu_use_fusion_emitters=false"
_PROBE = """
try:
    from jaxlib import xla_client
    xla_client.make_cpu_client()  # parses XLA_FLAGS
except (ImportError, AttributeError):  # jaxlib moved it: JAX's own way
    import jax
    jax.devices("cpu")
"""


def _with_xla_flags(flags: str) -> str:
    """`XLA_FLAGS` as it is, with `flags` added."""
    return f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()


def _xla_accepts(flags: str) -> bool:
    """Whether XLA starts with `flags` added to `XLA_FLAGS` (it aborts on a flag it does not
    know: releases rename and retire them)."""
    env = dict(os.environ, XLA_FLAGS=_with_xla_flags(flags), JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, timeout=120)
    return done.returncode == 0


# pytest-xdist's workers inherit the controller's environment, so they do not ask again
if _QUICK_CPU_CODEGEN.split("=")[0] not in os.environ.get("XLA_FLAGS", "") and _xla_accepts(_QUICK_CPU_CODEGEN):
    os.environ["XLA_FLAGS"] = _with_xla_flags(_QUICK_CPU_CODEGEN)

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)  # before any backend starts
jax.config.update("jax_default_matmul_precision", os.environ["JAX_DEFAULT_MATMUL_PRECISION"])
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_configure(config):
    if config.pluginmanager.hasplugin("benchmark"):  # its own pytest_configure runs last
        config.option.benchmark_disable = True
