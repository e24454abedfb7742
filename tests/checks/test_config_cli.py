"""``forge config show`` and ``forge run --dry-run`` through the real command line, in a fresh
process from the repository root: a config is loaded and validated as a run would load it,
printed with defaults and docs, and nothing is started. (The printing itself is unit-tested
in tests/unit/test_config_show.py.)"""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO, script_env


def _forge(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "forge.cli", *args],
        capture_output=True,
        text=True,
        env=script_env(),
        cwd=REPO,
        timeout=timeout,
    )


def test_config_show_prints_a_pipeline_with_its_stages_schemas():
    out = _forge("config", "show", "apps/sumdigits/cpu.yaml", "rl.steps=7")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "app: apps.sumdigits.main  # required; " in "\n".join(lines)
    rl = lines.index(next(line for line in lines if line.startswith("rl:")))
    stage = lines[rl:]
    # The rl stage is shown with the GRPO app's schema: its fields, defaults and docs.
    assert any(line.startswith("  steps: 7  # default: 100; ") for line in stage), stage
    assert any(line.startswith("  max_policy_age: 1  # ") for line in stage)
    assert any(line.startswith("    over_sampling_factor: 5.0  # default: 1.0; ") for line in stage)


def test_config_show_rejects_a_bad_override_with_the_usual_error():
    out = _forge("config", "show", "apps/sumdigits/cpu.yaml", "rl.rollout.group_sise=4")
    assert out.returncode == 2
    assert out.stdout == ""
    assert "forge config show: error: invalid config apps/sumdigits/cpu.yaml" in out.stderr
    assert "rl.rollout.group_sise: unknown key 'group_sise' (did you mean 'group_size'?)" in (
        out.stderr
    )
    assert "set by override 'rl.rollout.group_sise=4'" in out.stderr
    assert "Traceback" not in out.stderr


def test_run_dry_run_validates_prints_and_starts_nothing(tmp_path):
    run_dir = tmp_path / "run"
    args = ["--config", "apps/reinforce/cpu.yaml", "--run-dir", str(run_dir), "--dry-run"]
    out = _forge("run", *args, "steps=3")
    assert out.returncode == 0, out.stderr
    assert "steps: 3  # default: 100; " in out.stdout
    assert "baseline_decay: 0.9  # " in out.stdout
    assert not run_dir.exists()  # no run directory, no config.yaml, no processes
    bad = _forge("run", *args, "trainer.parallelism=ddpp")
    assert bad.returncode == 2
    assert "trainer.parallelism: 'ddpp' is not one of" in bad.stderr
    assert not run_dir.exists()


def test_config_show_on_the_main_job_shows_the_seed_reaching_every_role():
    # Resolving smollm2-135m-instruct converts its GGUF once (~20 s) into the cache.
    out = _forge("config", "show", "apps/arith/smollm2.yaml", "seed=3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "seed: 3  # default: 0; " in out.stdout
    # the rl stage's seed, its trainer's and generator's: copies, marked with the key they follow
    for indent in ("  ", "    "):
        assert f"{indent}seed: 3  # = seed" in lines, indent
