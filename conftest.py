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
- XLA's compiled programs are kept in JAX's persistent compilation cache, `.jax_cache/` at
  the repository root (git ignores it), small ones included: the suite compiles many
  programs that are the same (a rule's check program, traced afresh by every test that
  checks it), which xdist's workers, the subprocesses and the next run then read instead of
  compiling (a second run of the suite on 2 cores: 2:57 against 8:30 cold, jax 0.12.1; in
  CI, the fallback lowering's run reads most of what the floor run compiled, and the check
  what the suite compiled). JAX keys an entry by the whole program with its compile options
  and the jax/jaxlib versions, so nothing stale is read: a changed rule or JAX compiles
  anew. Set in the environment, so subprocesses inherit it; emptied when it
  has grown past 2 GiB; `JAX_COMPILATION_CACHE_DIR=other/dir pytest` keeps it elsewhere and
  `JAX_COMPILATION_CACHE_DIR= pytest` turns it off. A torn entry (two workers writing one
  program at once) is read as a miss: JAX warns, which is not an error here.
- pytest-benchmark, when installed (the suite does not use it), is turned off: under xdist
  it warns at start-up, and warnings are errors here.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

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

_COMPILATION_CACHE_LIMIT = 2 << 30  # bytes


def _size(directory: Path) -> int:
    return sum(entry.stat().st_size for entry in directory.iterdir() if entry.is_file())


if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    cache = Path(__file__).resolve().parent / ".jax_cache"
    if "PYTEST_XDIST_WORKER" not in os.environ and cache.is_dir() and _size(cache) > _COMPILATION_CACHE_LIMIT:
        shutil.rmtree(cache, ignore_errors=True)  # stale programs of older code and JAX versions
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(cache)
if os.environ["JAX_COMPILATION_CACHE_DIR"]:
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)  # before any backend starts
jax.config.update("jax_default_matmul_precision", os.environ["JAX_DEFAULT_MATMUL_PRECISION"])
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"] or None)
jax.config.update("jax_persistent_cache_min_compile_time_secs", float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", 1)))
jax.config.update("jax_persistent_cache_min_entry_size_bytes", int(os.environ.get("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", 0)))


def pytest_configure(config):
    if config.pluginmanager.hasplugin("benchmark"):  # its own pytest_configure runs last
        config.option.benchmark_disable = True
