"""Every notebook runs top to bottom in a real Jupyter kernel (nbclient + ipykernel, the ``dev`` extra) on CPU, every
code cell in order, shows at least one picture, writes nothing into its working directory, and is stored with its
outputs stripped. The notebooks import ``app`` and define nothing the package needs."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))
CELL_HANG_GUARD_S = 60
"""A cell still running after this long fails the test as a hang, naming the cell (nbclient's ``CellTimeoutError``);
never a bound on how long a notebook takes."""


def test_there_are_notebooks_for_each_paper_and_the_flow_samplers():
    names = {p.stem for p in NOTEBOOKS}
    assert {"rewards", "ot_grpo", "reason_rft", "core_trisr", "vbvr", "flow_samplers"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code, f"{path.name} has no code cell"
    assert all(not cell.outputs and cell.execution_count is None for cell in code), (
        f"{path.name} is stored with outputs: strip them (jupyter nbconvert --clear-output --inplace {path.name})"
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_a_kernel(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=CELL_HANG_GUARD_S, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError naming the cell on any exception
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    ran = [cell.execution_count for cell in code]
    assert ran == list(range(1, len(code) + 1)), f"{path.name}: not every code cell ran, in order (counts {ran})"
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} shows no picture"
    assert not list(tmp_path.iterdir()), "a notebook cell wrote files into its working directory"
