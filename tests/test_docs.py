"""The documentation and packaging stay true: docs/api.md is current, links resolve, the
license and the type-hint markers ship."""

import ast
import importlib
import importlib.resources
import importlib.util
import inspect
import pathlib
import re
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("rules", "rules.testing", "zygote_jax")


def _build_api():
    spec = importlib.util.spec_from_file_location("build_api", ROOT / "docs" / "build_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reexports(package: str) -> list[str]:
    """The public names an `__init__.py` binds with `from ... import x as x`, in order."""
    source = pathlib.Path(importlib.import_module(package).__file__).read_text()
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom):
            names += [a.asname or a.name for a in node.names if not (a.asname or a.name).startswith("_")]
    return names


def test_api_md_is_current(tmp_path):
    build_api = _build_api()
    out = tmp_path / "api.md"
    assert build_api.main(["--output", str(out)]) == 0
    committed = (ROOT / "docs" / "api.md").read_text()
    assert out.read_text() == committed, "docs/api.md is stale: run `python docs/build_api.py`"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_is_in_the_api_reference(package):
    api = (ROOT / "docs" / "api.md").read_text()
    module = importlib.import_module(package)
    reexported = _reexports(package)
    # public attributes that are not re-exported are submodules (rules.testing, rules._x)
    public = [n for n, v in vars(module).items() if not n.startswith("_") and not inspect.ismodule(v)]
    assert set(public) <= set(reexported), f"{package} has public names its __init__ does not re-export"
    missing = [n for n in reexported if f"#### `{package}.{n}`\n" not in api]
    assert not missing, f"docs/api.md lacks {missing}: run `python docs/build_api.py`"
    grouped = [n for _, names in _build_api().exported_groups(module) for n in names]
    assert grouped == reexported  # every name under a heading, once, in the file's order


def test_relative_links_in_readme_and_docs_resolve():
    for page in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]:
        prose = re.sub(r"(?ms)^(`{3,}).*?^\1\s*$", "", page.read_text())  # fenced blocks
        prose = re.sub(r"`[^`\n]*`", "", prose)  # inline code
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            assert path.is_file(), f"{page.name} links to missing {target}"
            assert path.is_relative_to(ROOT), f"{page.name} links outside the repository: {target}"
    readme = (ROOT / "README.md").read_text()
    assert "docs/design.md" in readme and "docs/api.md" in readme


def test_license_file_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"  # an SPDX expression (PEP 639)
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the zygote-jax developers" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text


@pytest.mark.parametrize("package", ["rules", "zygote_jax"])
def test_packages_ship_py_typed(package):
    # PEP 561: the marker sits in the installed top-level package and is declared as package data
    assert importlib.resources.files(package).joinpath("py.typed").is_file()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data[package]


def test_edge_table_is_right_and_in_the_readme():
    """docs/build_edges.py: through rules.library.jax every edge gradient is the true one, and
    README.md shows every row (its plain-JAX column is of the release it was made with)."""
    spec = importlib.util.spec_from_file_location("build_edges", ROOT / "docs" / "build_edges.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    computed = module.rows()  # what `main(["--check"])` checks, computed once
    assert module.wrong(computed) == []
    module.rows = lambda: computed  # the command line, on what was computed
    assert module.main(["--check"]) == 0
    module.rows = lambda: [(computed[0][0], computed[0][1], computed[0][2] + 1.0), *computed[1:]]
    assert module.main(["--check"]) == 1  # a wrong gradient fails it
    readme = (ROOT / "README.md").read_text()
    table = readme.split(module.BEGIN)[1].split(module.END)[0]
    for edge, _, ours in computed:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{edge.call}` |"))
        assert row.split(" | ")[2:4] == [f"{ours:.4g}", f"{edge.true:.4g}"], row
