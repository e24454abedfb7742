"""``forge.notebook.status()`` as a cell's output in a real Jupyter kernel: the same view as
``forge top``, of the kernel's own services, rendered as HTML by rich."""

from __future__ import annotations

import pytest

from tests.helpers import REPO

CELLS = [
    "from forge.notebook import once, status, stop_all\n"
    "from tests.integration.controller.service_actors import Echo\n"
    "svc = await once('echo', lambda: Echo.options(num_replicas=2).as_service())\n"
    "await svc.echo.route(1)",
    "status()",
    "await stop_all()\nstatus()",
]


@pytest.mark.timeout(180)
def test_status_is_a_rich_cell_output(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    )
    client.execute()
    live = nb.cells[1].outputs[0]["data"]
    assert "<pre" in live["text/html"]
    for want in ("forge top", "Echo", "healthy", "RUNNING"):
        assert want in live["text/plain"], live["text/plain"]
    assert live["text/plain"].count("healthy") == 2
    after = nb.cells[2].outputs[0]["data"]["text/plain"]
    assert "Echo" not in after  # stopped services leave the view
