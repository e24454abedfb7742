"""The GRPO notebook runs top to bottom in a real Jupyter kernel (nbclient + ipykernel)."""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO, pid_alive


def test_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    nb = nbformat.read(REPO / "apps/grpo/notebook.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    )
    client.execute()
    outputs = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "held-out accuracy after SFT" in outputs and "stopped" in outputs
    shown = "".join(
        o.get("data", {}).get("text/plain", "") for c in nb.cells for o in c.get("outputs", [])
    )
    assert "Generator" in shown and "RewardActor" in shown and "healthy" in shown  # status()
    # the trainer's processes are gone after the last cell
    (pids,) = re.findall(r"trainer pids \[([\d, ]+)\]", outputs)
    assert [p for p in map(int, pids.split(",")) if pid_alive(p)] == []
