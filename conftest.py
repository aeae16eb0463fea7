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
- pytest-benchmark, when installed (the suite does not use it), is turned off: under xdist
  it warns at start-up, and warnings are errors here.
"""

import os

os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)  # before any backend starts
jax.config.update("jax_default_matmul_precision", os.environ["JAX_DEFAULT_MATMUL_PRECISION"])
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_configure(config):
    if config.pluginmanager.hasplugin("benchmark"):  # its own pytest_configure runs last
        config.option.benchmark_disable = True
