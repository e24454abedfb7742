"""A GRPO run with ``weights: {type: broadcast}`` (the trainer sends each version to both
generator replicas in one gloo group, as NCCL would between GPUs) whose generator replica is
SIGKILLed mid-run: the next push forms a new group with the restarted replica, which then
serves the versions that follow; the run finishes and every replica ends at the last version.
Resumed from its checkpoint, the replicas start on the restored version the same way."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.helpers import (
    REPO,
    run_killing_a_generator,
    run_metrics,
    script_env,
    tiny_grpo_config,
    wait_dead,
)

STEPS = 60
KILL_AT = 4


@pytest.mark.timeout(600)
def test_broadcast_weights_reach_every_replica_and_a_restarted_one_joins_a_new_group(tmp_path):
    extra = (
        "replicas: {generator: 2}\nweights: {type: broadcast, backend: gloo}\ncheckpoint_every: 30"
    )
    config, run = tiny_grpo_config(tmp_path, STEPS, extra), tmp_path / "run"
    r = run_killing_a_generator(config, run, KILL_AT)
    out, err = r["out"], r["err"]
    assert r["returncode"] == 0, out[-2000:] + err[-4000:]
    assert wait_dead([r["victim"]], 5) == []
    steps = [row for row in run_metrics(run) if "train/loss" in row]
    assert steps[-1]["step"] == STEPS
    assert "could not be broadcast" not in err, err[-4000:]
    # every replica, the restarted one included, ended at the last version pushed
    status = json.loads((run / "status.json").read_text())
    versions = status["extra"]["rl"]["generator_versions"]
    assert sorted(versions) == ["0", "1"] and min(versions.values()) >= STEPS - 1, versions
    recovered = re.findall(r"recovered: serving weight version (\d+)", err)
    assert len(recovered) == 1, err[-4000:]  # at its starting weights: nothing to pull by number
    print(f"replica versions at the end {versions}; recovered at {recovered[0]}")
    # resumed from its last checkpoint for 20 more steps: the replicas start on the restored
    # version through a broadcast too
    more = subprocess.run(
        [sys.executable, "-m", "forge.cli", "run", "--resume", str(run), f"steps={STEPS + 20}"],
        capture_output=True,
        text=True,
        env=script_env(),
        cwd=REPO,
        timeout=300,
    )
    assert more.returncode == 0, more.stdout[-2000:] + more.stderr[-4000:]
    status = json.loads((run / "status.json").read_text())
    assert min(status["extra"]["rl"]["generator_versions"].values()) >= STEPS + 19
