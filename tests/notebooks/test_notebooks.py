"""Every notebook in notebooks/ runs top to bottom in a fresh `python3` kernel.

The notebooks assert their own numbers, so a notebook that runs is a notebook that is
right. They are stored without outputs; this test executes an in-memory copy (cwd: the
notebooks folder) and never writes it back. A failing cell is reported with its source and
the kernel's traceback.
"""

import pathlib
import re
import time

import nbformat
import pytest

NOTEBOOKS_DIR = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 120
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# jupyter_core < 5.9 warns when jupyter_client imports its paths module, which is no concern
# of the notebooks. nbclient is imported inside the test (not at collection), so this mark
# covers that import.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Jupyter is migrating its paths to use standard platformdirs:DeprecationWarning"
)


def failing_cell_report(nb: nbformat.NotebookNode) -> str:
    """The source and traceback of the first cell whose outputs hold an error."""
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                traceback = ANSI_ESCAPE.sub("", "\n".join(output.get("traceback", [])))
                return (
                    f"cell {index} failed:\n{cell.source}\n\n"
                    f"{output.get('ename')}: {output.get('evalue')}\n{traceback}"
                )
    return ""


def test_notebooks_are_found():
    assert NOTEBOOKS, f"no notebooks in {NOTEBOOKS_DIR}"


def test_notebooks_are_stored_without_outputs():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernelspec is not python3"
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, (
                    f"{path.name}: cell {index} is stored with outputs; clear them before committing"
                )


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
    )
    start = time.perf_counter()
    failure = None
    try:
        client.execute()
    except CellExecutionError as err:
        failure = failing_cell_report(nb) or str(err)
    if failure is not None:  # raised outside the except: no chained kernel traceback in the report
        pytest.fail(f"{path.name}: {failure}", pytrace=False)
    print(f"{path.name}: {time.perf_counter() - start:.1f} s")
