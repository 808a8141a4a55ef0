"""``examples/quickstart.ipynb`` runs top to bottom in a kernel of this environment's Python, with its
run written to a temporary directory (a cell after the parameters cell sets ``OUTPUT``)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.helpers import ROOT

NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def test_the_quickstart_notebook_runs(tmp_path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    # Arrange: the run goes to tmp_path
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    parameters = next(
        i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", [])
    )
    output = tmp_path / "quickstart"
    notebook.cells.insert(parameters + 1, nbformat.v4.new_code_cell(f"OUTPUT = Path({str(output)!r})"))

    # Execute: "python3" is ipykernel's own kernel, started with this interpreter
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()

    # Assert: the run was made where asked, its rows were shown, the model generated
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == [0, 1, 2]
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    assert not [out for out in outputs if out.output_type == "error"]
    assert any("image/png" in out.get("data", {}) for out in outputs)
    printed = "".join(out.get("text", "") for out in outputs if out.output_type == "stream")
    assert ">>> Define the word 'harbor'." in printed and ">>> Give an antonym of 'cold'." in printed
