"""The suite's own settings (the root conftest.py) take effect."""

import os
import pathlib

import pytest

ROOT_CONFTEST = pathlib.Path(__file__).resolve().parents[1] / "conftest.py"


@pytest.fixture(scope="module")
def conftest(request):
    plugin = request.config.pluginmanager.get_plugin(str(ROOT_CONFTEST))
    assert plugin is not None, f"{ROOT_CONFTEST} is not loaded"
    return plugin


def test_xla_compiles_with_the_elemental_emitter_where_it_knows_the_flag(conftest):
    flag = conftest._QUICK_CPU_CODEGEN
    flags = os.environ.get("XLA_FLAGS", "")
    if flag.split("=")[0] in flags and flag not in flags:
        pytest.skip(f"XLA_FLAGS={flags!r} chooses the emitter itself")  # the documented opt-out
    assert (flag in flags) == conftest._xla_accepts(flag)


def test_the_probe_tells_an_unknown_xla_flag(conftest):
    assert not conftest._xla_accepts("--xla_no_such_flag_of_any_release=1")


_ELEMENTWISE = """
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
x = np.random.default_rng(0).standard_normal(4096) * 5
functions = [jnp.tanh, jnp.exp, lambda x: jnp.log(jnp.abs(x)), jax.scipy.special.erf, jnp.sin, jax.nn.sigmoid,
             lambda x: jnp.abs(x) ** 1.7, lambda x: jnp.arctan2(x, 1.3 - x),
             lambda x: jax.nn.gelu(x, approximate=True),
             lambda x: jnp.tanh(x) * jnp.exp(-x * x) + jnp.log1p(x * x)]
results = np.stack([np.asarray(jax.jit(f)(x.astype(dt)), np.float64)
                    for dt in (np.float32, np.float64) for f in functions])
"""


def test_the_suites_cpu_code_computes_the_same_bits_as_xlas_default(conftest, tmp_path):
    """The elemental emitter (the suite's setting, in this process) and XLA's default
    emitters (in a subprocess) give identical element-wise results, so the suite checks the
    numbers a user's program computes."""
    import subprocess
    import sys

    import numpy as np

    flag = conftest._QUICK_CPU_CODEGEN
    if flag not in os.environ.get("XLA_FLAGS", ""):
        pytest.skip("the suite runs with XLA's default emitters here")
    # the default emitters named, not only the suite's flag dropped: a jaxlib whose default
    # changed would otherwise compare the elemental emitter with itself
    default = " ".join([*(f for f in os.environ["XLA_FLAGS"].split() if f != flag), flag.replace("=false", "=true")])
    save = f"\nnp.save({str(tmp_path / 'default.npy')!r}, results)"
    env = dict(os.environ, XLA_FLAGS=default, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", _ELEMENTWISE + save], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    namespace: dict = {}
    exec(_ELEMENTWISE, namespace)
    np.testing.assert_array_equal(namespace["results"], np.load(tmp_path / "default.npy"))


_CACHED = """
import jax, jax.numpy as jnp
print(float(jax.jit(lambda x: jnp.sin(x) * {constant!r})(1.0)))
"""


def test_compiled_programs_are_kept_for_the_workers_subprocesses_and_the_next_run():
    """JAX's persistent compilation cache is on for the small programs too, in this process
    and in subprocesses: a program compiled by one process is read by the next."""
    import subprocess
    import sys
    import uuid

    import jax

    directory = os.environ["JAX_COMPILATION_CACHE_DIR"]
    if not directory:
        pytest.skip("`JAX_COMPILATION_CACHE_DIR=` turned the cache off")  # the documented opt-out
    assert jax.config.jax_compilation_cache_dir == directory
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    code = _CACHED.format(constant=1.0 + uuid.uuid4().int % 10**9 / 10**10)  # a program no one compiled
    env = dict(os.environ, JAX_LOG_COMPILES="1")
    first, second = (subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
                     for _ in range(2))
    assert first.returncode == 0 and second.returncode == 0, first.stderr[-3000:] + second.stderr[-3000:]
    assert "Persistent compilation cache hit" not in first.stderr
    assert "Persistent compilation cache hit" in second.stderr, second.stderr[-3000:]
