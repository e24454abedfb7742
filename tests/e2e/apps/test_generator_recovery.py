"""A GRPO run (two generator replicas, nothing about weights configured) whose generator
replica is SIGKILLed mid-run: the service restarts it, and before it takes traffic it loads
the latest version the trainer published at the run's default location, so its first
completions are stamped with that version, not 0. The run finishes normally."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import run_killing_a_generator, run_metrics, tiny_grpo_config, wait_dead

STEPS = 100
KILL_AT = 4  # trained steps (so pushed versions) before the kill


def _config(tmp_path: Path) -> Path:
    return tiny_grpo_config(tmp_path, STEPS, "replicas: {generator: 2}")


@pytest.mark.timeout(600)
def test_killed_generator_replica_serves_the_latest_version_after_restart(tmp_path):
    config, run = _config(tmp_path), tmp_path / "run"
    r = run_killing_a_generator(config, run, KILL_AT)
    out, err, gens, victim = r["out"], r["err"], r["gens"], r["victim"]
    trained_at_kill = r["trained_at_kill"]
    assert r["returncode"] == 0, out[-2000:] + err[-4000:]
    assert wait_dead([victim], 5) == []

    # The restarted replica (a new process of the same replica) recovered at the latest
    # version published when it restarted: at least the one trained before the kill.
    recovered = re.findall(
        r"generator (Generator-r\d+)-\d+ \(pid (\d+)\) recovered: serving weight version (\d+)",
        err,
    )
    assert len(recovered) == 1, err[-4000:]
    replica, pid, at_recover = recovered[0][0], int(recovered[0][1]), int(recovered[0][2])
    assert gens[victim].startswith(replica + "-") and pid != victim
    assert at_recover >= trained_at_kill >= KILL_AT, (at_recover, trained_at_kill)
    # ... and its first completions carry that version (or a newer one pushed meanwhile).
    first = re.findall(
        rf"generator {replica}-\d+ \(pid {pid}\): first completions after recovery at weight "
        r"version (\d+)",
        err,
    )
    assert len(first) == 1 and int(first[0]) >= at_recover > 0, err[-4000:]
    back = re.search(r"replica \d+ is back after ([\d.]+) s", err + out)
    assert back, err[-4000:]
    print(
        f"killed {gens[victim]} (pid {victim}) after step {trained_at_kill}; restarted as "
        f"pid {pid} at version {at_recover}, first completions at version {first[0]}; "
        f"restart to serving: {back.group(1)} s"
    )
    steps = [r["step"] for r in run_metrics(run) if "train/loss" in r]
    assert steps[-1] == STEPS
