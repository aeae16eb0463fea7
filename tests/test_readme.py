"""README.md must stay true: its Python tour runs, and it opens with the two commands."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_main_job_and_the_test_command():
    first_block = re.search(r"```bash\n(.*?)```", README, flags=re.S).group(1)
    lines = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert lines == ['pip install -e . && python -m rules check', 'pip install -e ".[test]" && python -m pytest']
    ci = (ROOT / ".ci" / "run").read_text()
    assert lines[1] in ci  # CI runs exactly the README's test command


def test_the_tour_runs():
    tour = re.search(r"## Tour\n\n```python\n(.*?)```", README, flags=re.S).group(1)
    assert len(tour.strip().splitlines()) <= 30
    namespace: dict = {}
    exec(compile(tour, "README.md (tour)", "exec"), namespace)
    assert float(namespace["back"](1.0)[0]) == __import__("pytest").approx(0.8775825618903728)
