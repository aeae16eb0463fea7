"""README.md must stay true: its Python tour runs, and it opens with the two commands."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_main_job_and_the_test_command():
    first_block = re.search(r"```bash\n(.*?)```", README, flags=re.S).group(1)
    lines = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert lines == ['pip install -e . && python -m rules check',
                     'pip install -e ".[test]" && python -m pytest -n auto']
    ci = (ROOT / ".ci" / "run").read_text()
    assert lines[1] in ci  # CI runs exactly the README's test command


def test_the_tour_runs():
    tour = re.search(r"## Tour\n\n```python\n(.*?)```", README, flags=re.S).group(1)
    assert len(tour.strip().splitlines()) <= 30
    namespace: dict = {}
    exec(compile(tour, "README.md (tour)", "exec"), namespace)
    assert float(namespace["back"](1.0)[0]) == __import__("pytest").approx(0.8775825618903728)


def test_the_tour_runs_clean_with_jax_defaults(tmp_path):
    # the suite runs with x64 on; a reader's first run has JAX's defaults (float32), where
    # any warning (e.g. "Explicitly requested dtype float64 ... truncated") is an error here
    tour = re.search(r"## Tour\n\n```python\n(.*?)```", README, flags=re.S).group(1)
    script = tmp_path / "tour.py"
    script.write_text(tour)
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"} | {"JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-W", "error", str(script)], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_custom_vjp_example_runs():
    block = re.search(r"### Checking `jax.custom_vjp`.*?```python\n(.*?)```", README, flags=re.S).group(1)
    namespace: dict = {}
    exec(compile(block, "README.md (custom_vjp)", "exec"), namespace)
    assert (namespace["report"].kind, namespace["report"].modes) == ("jax.vjp", "rev")


def test_the_drop_in_namespace_example_runs():
    block = re.search(r"### One import away.*?```python\n(.*?)```", README, flags=re.S).group(1)
    namespace: dict = {}
    exec(compile(block, "README.md (rules.library.jax)", "exec"), namespace)
    assert float(namespace["hypot_slope"]) == 0.0
