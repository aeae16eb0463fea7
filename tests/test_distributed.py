"""Rules compose with `jax.distributed`: a data-parallel gradient step through library rules,
run by two CPU processes with JAX's multi-process runtime, equals the single-process one.

The test writes a worker script into `tmp_path` and starts it twice (process 0 and 1) with
`subprocess.Popen`, on loopback only: the coordinator binds and connects to 127.0.0.1 on a
free port, and gloo, JAX's CPU collectives, is told the host name 127.0.0.1. Each process
has one CPU device; the batch is sharded over the mesh of both (`NamedSharding`, built with
`jax.make_array_from_process_local_data`), the parameters are replicated
(`jax.make_array_from_callback`), and `jax.jit` computes the gradient of a loss that uses a
`rules.primitive` with an rrule defined in the script, `rules.library.linalg.logdet` and
`rules.library.nn.softmax_cross_entropy`; the gradient with respect to the replicated
parameters comes out replicated, so each process writes its own copy as JSON. The pytest
process imports the same script as a module and differentiates the same loss on the whole
batch with plain `jax.grad`; both processes' gradients must match it to rtol 1e-10
(float64).

Clean-up: the workers run under one deadline (`communicate(timeout=...)`, 120 s in all); as
soon as one fails, or the deadline passes, every started process that is still running is
killed and reaped (`try`/`finally`), and the failure shows both processes' stderr. A worker
that raises exits at once (`os._exit`), without waiting in JAX's shutdown barrier for a peer.

Skipped only where the installed JAX has no CPU collectives (neither the
`jax_cpu_collectives_implementation` option nor the older `jax_cpu_enable_gloo_collectives`,
or a jaxlib without gloo).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEADLINE_S = 120
NUM_PROCESSES = 2

WORKER = r'''
"""One process of tests/test_distributed.py (argv[1]: JSON of process_id, port, the CPU
collectives option and its value, the output path). Imported as a module, it only defines
the problem: the pytest process computes its reference from the same `loss` and `problem`."""

import functools
import json
import os
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import rules
from rules.library.linalg import logdet
from rules.library.nn import softmax_cross_entropy

BATCH, FEATURES, HIDDEN, CLASSES = 8, 4, 3, 3


@rules.primitive
def logcosh(x):
    return jnp.log(jnp.cosh(x))


@logcosh.rrule
def logcosh_rrule(x):
    def logcosh_pullback(y_bar):
        return rules.NoTangent(), rules.unthunk(y_bar) * jnp.tanh(x)

    return logcosh(x), logcosh_pullback


def loss(params, x, onehot):
    w1, w2 = params
    logits = logcosh(x @ w1) @ w2
    data = jnp.mean(softmax_cross_entropy(logits, onehot))
    prior = logdet(w1.T @ w1 + jnp.eye(HIDDEN, dtype=w1.dtype))
    return data + 0.1 * prior


def problem():
    """Parameters (w1, w2), inputs and one-hot labels, as float64 NumPy arrays."""
    rng = np.random.default_rng(0)
    params = (rng.standard_normal((FEATURES, HIDDEN)), rng.standard_normal((HIDDEN, CLASSES)))
    x = rng.standard_normal((BATCH, FEATURES))
    onehot = np.eye(CLASSES)[rng.integers(0, CLASSES, BATCH)]
    return params, x, onehot


def _gloo_on_loopback():
    """Gloo listens on the address of the machine's host name unless given a host name, and
    JAX's config has no setting for it: wrap the factory JAX calls, where it takes one."""
    try:
        from jax._src.lib import _jax as lib
    except ImportError:
        return
    make = getattr(lib, "make_gloo_tcp_collectives", None)
    if make is not None and "hostname" in (make.__doc__ or ""):
        lib.make_gloo_tcp_collectives = functools.partial(make, hostname="127.0.0.1")


def main(process_id, port, option, value, out):
    jax.config.update("jax_enable_x64", True)
    jax.config.update(option, value)
    _gloo_on_loopback()
    address = f"127.0.0.1:{port}"
    jax.distributed.initialize(coordinator_address=address, coordinator_bind_address=address,
                               num_processes=2, process_id=process_id,
                               initialization_timeout=60, shutdown_timeout_seconds=60)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("batch",))
    batch = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    params, x, onehot = problem()
    rows = slice(process_id * BATCH // 2, (process_id + 1) * BATCH // 2)  # this process's half
    x_global = jax.make_array_from_process_local_data(batch, x[rows], x.shape)
    onehot_global = jax.make_array_from_process_local_data(batch, onehot[rows], onehot.shape)
    params_global = tuple(jax.make_array_from_callback(p.shape, replicated, lambda index, p=p: p[index])
                          for p in params)

    step = jax.jit(jax.value_and_grad(loss), out_shardings=replicated)
    compiled = step.lower(params_global, x_global, onehot_global).compile()
    value_, grads = compiled(params_global, x_global, onehot_global)
    result = {
        "process_id": process_id,
        "process_count": jax.process_count(),
        "global_devices": len(jax.devices()),
        "local_devices": len(jax.local_devices()),
        "batch_fully_addressable": x_global.is_fully_addressable,
        "collectives": [option, jax.config.values[option]],
        "all_reduce_in_hlo": "all-reduce" in compiled.as_text(),
        "grads_replicated": all(g.sharding.is_fully_replicated for g in grads),
        "loss": float(np.asarray(value_.addressable_data(0))),
        "grads": [np.asarray(g.addressable_data(0)).tolist() for g in grads],
    }
    with open(out + ".part", "w") as f:
        json.dump(result, f)
    os.replace(out + ".part", out)
    jax.distributed.shutdown()


if __name__ == "__main__":
    try:
        main(*json.loads(sys.argv[1]))
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # not JAX's atexit shutdown, which waits for the peer
'''


def _cpu_collectives() -> tuple[str, object] | None:
    """The `jax.config` option and value that turn on JAX's CPU collectives across processes
    (gloo), or None where this JAX has none."""
    try:
        from jax._src import lib
    except ImportError:
        return None
    extensions = [getattr(lib, name, None) for name in ("_jax", "xla_extension")]
    if not any(hasattr(ext, "make_gloo_tcp_collectives") for ext in extensions if ext is not None):
        return None
    if "jax_cpu_collectives_implementation" in jax.config.values:
        return "jax_cpu_collectives_implementation", "gloo"
    if "jax_cpu_enable_gloo_collectives" in jax.config.values:  # JAX before the enum option
        return "jax_cpu_enable_gloo_collectives", True
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_env() -> dict[str, str]:
    """The inherited environment on one CPU device per process: JAX_PLATFORMS=cpu, no
    JAX_NUM_CPU_DEVICES, no forced host device count in XLA_FLAGS; this checkout first on
    the path. No persistent compilation cache (the suite's, root conftest.py): where the two
    processes read their programs from it (a second run), jax 0.12.1 hangs in the first
    collective on CPU; compiled afresh, they run."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    env["JAX_COMPILATION_CACHE_DIR"] = ""
    flags = [f for f in env.pop("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _import_worker(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"distributed_worker_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_workers(script: pathlib.Path, option: str, value: object, folder: pathlib.Path) -> list[dict]:
    port = _free_port()
    env = _worker_env()
    outs = [folder / f"grads{i}.json" for i in range(NUM_PROCESSES)]
    logs = [folder / f"worker{i}.stderr" for i in range(NUM_PROCESSES)]
    procs: list[subprocess.Popen] = []
    files = []
    failure = None
    try:
        for i in range(NUM_PROCESSES):
            files.append(open(logs[i], "wb"))
            procs.append(subprocess.Popen([sys.executable, str(script), json.dumps([i, port, option, value, str(outs[i])])],
                                          stdin=subprocess.DEVNULL, stdout=files[i], stderr=subprocess.STDOUT,
                                          env=env, cwd=folder))
        deadline = time.monotonic() + DEADLINE_S
        while failure is None and any(p.returncode is None for p in procs):
            for i, p in enumerate(procs):
                if p.returncode is None:
                    try:
                        p.communicate(timeout=min(0.2, max(deadline - time.monotonic(), 0.01)))
                    except subprocess.TimeoutExpired:
                        pass
                if p.returncode not in (None, 0):
                    failure = f"process {i} exited with status {p.returncode}"
            if failure is None and time.monotonic() > deadline and any(p.returncode is None for p in procs):
                failure = f"timed out after {DEADLINE_S} s"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for f in files:
            f.close()
    if failure is None and not all(out.exists() for out in outs):
        failure = "a process exited without writing its gradients"
    if failure is not None:
        stderr = "\n".join(f"--- process {i} (status {p.returncode}) stderr:\n{logs[i].read_text(errors='replace')[-6000:]}"
                           for i, p in enumerate(procs))
        pytest.fail(f"two-process run failed: {failure}\n{stderr}", pytrace=False)
    return [json.loads(out.read_text()) for out in outs]


@pytest.mark.slow
def test_distributed_data_parallel_gradient_matches_single_process(tmp_path):
    collectives = _cpu_collectives()
    if collectives is None:
        pytest.skip("this JAX has no CPU collectives (no jax_cpu_collectives_implementation or "
                    "jax_cpu_enable_gloo_collectives option, or a jaxlib without gloo)")
    option, value = collectives
    script = tmp_path / "worker.py"
    script.write_text(WORKER)

    worker = _import_worker(script)
    params, x, onehot = worker.problem()
    cpu = jax.devices("cpu")[0]
    loss, grads = jax.value_and_grad(worker.loss)(jax.device_put(tuple(params), cpu),
                                                  jax.device_put(x, cpu), jax.device_put(onehot, cpu))
    want = [np.asarray(g) for g in grads]
    assert all(g.dtype == np.float64 for g in want)

    results = _run_workers(script, option, value, tmp_path)
    for i, got in enumerate(results):
        assert got["process_id"] == i
        assert (got["process_count"], got["global_devices"], got["local_devices"]) == (2, 2, 1), got
        assert got["collectives"] == [option, value]
        assert not got["batch_fully_addressable"]  # each process holds half the batch
        assert got["all_reduce_in_hlo"]  # the gradient is summed across the processes
        assert got["grads_replicated"]
        np.testing.assert_allclose(got["loss"], float(loss), rtol=1e-10, err_msg=f"process {i}: loss")
        for name, g, w in zip(("w1", "w2"), got["grads"], want):
            np.testing.assert_allclose(np.array(g), w, rtol=1e-10, atol=0, err_msg=f"process {i}: gradient of {name}")
