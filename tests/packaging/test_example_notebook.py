"""examples/quickstart.ipynb runs headless top to bottom (nbclient, a real Jupyter kernel) and is
kept in git without outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def test_notebook_is_stored_without_outputs():
    nb = json.loads(NOTEBOOK.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, "no code cells"
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)


@pytest.mark.slow
def test_notebook_executes_without_errors():
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel starts in the checkout (as `jupyter lab` started there would) and runs this
    # interpreter (ipykernel's own kernel spec). Any cell error raises CellExecutionError.
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if PLOTLY_MIME in o.get("data", {})]
    # the result's own display, the head view, the model view, the statistics heatmap, the routes
    # and the logit lens
    assert len(figures) == 6
    for o in figures:
        assert len(json.dumps(dict(o["data"]))) < 5_000_000
    summary = figures[0]["data"]["text/plain"]
    assert "smollm2-135m" in summary and "30 × 9 (3 KV heads, GQA)" in summary
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "of its weight on the previous token" in printed and "max |textbook - model|" in printed
