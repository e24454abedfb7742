"""A user's own task, as a new user brings it: a package outside the repository with a
gym-style environment, a tool given as a {name, fn, schema} dict, a reward function next to
the environment, SFT transcripts and RL tasks in JSONL files with a split field and no
target, trained with the generic pipeline (``apps.pipeline.main``: ``sft:`` then ``rl:``)
with evaluation switched off. The run must finish, save the final policy, write episodes
that ``forge episodes`` shows, and end with the pipeline's last line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.helpers import REPO, forge_run, script_env

GAME = '''
"""Say the code of a key: look it up with the tool, then answer it."""

CODES = {"red": "17", "blue": "42", "green": "8"}


def lookup(**kw):
    return CODES.get(kw.get("key"), "unknown key")


class CodeGame:
    def reset(self, task):
        self.key, self.turns = task["key"], 0
        return f"What is the code of {self.key}? Answer with the number."

    def step(self, action):  # gym-style: (observation, reward, done, info)
        self.turns += 1
        ok = action.strip() == CODES[self.key]
        if ok or self.turns >= 2:
            return None, {"success": float(ok)}, True, {}
        return "No. Try again.", {"success": 0.0}, False, {"state": self.turns}


def brevity(prompt, response, target):
    return {"brevity": 1.0 if len(response) <= 4 else 0.0}
'''


def _files(tmp_path):
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "game.py").write_text(textwrap.dedent(GAME))
    codes = {"red": "17", "blue": "42", "green": "8"}
    sft = [
        {
            "messages": [
                {"role": "user", "content": f"What is the code of {k}? Answer with the number."},
                {"role": "assistant", "content": v},
            ]
        }
        for k, v in codes.items()
    ]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft * 4))
    tasks = [{"prompt": k, "key": k, "split": "test" if k == "green" else "train"} for k in codes]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tasks))
    schema = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
    config = tmp_path / "task.yaml"
    config.write_text(
        f"""
app: apps.pipeline.main
preset: tiny
sft:
  policy: {{model: from-run}}
  steps: 4
  batch_size: 4
  data: {{fn: jsonl, kwargs: {{path: {tmp_path / "sft.jsonl"}, heldout_size: 0}}}}
  trainer: {{loss: {{type: reinforce}}, optimizer: {{lr: 1.0e-3}}}}
rl:
  policy: {{model: from-run}}
  steps: 2
  data: {{fn: jsonl, kwargs: {{path: {tmp_path / "tasks.jsonl"}}}}}
  rewards: [userpkg.game:brevity]
  env:
    fn: userpkg.game:CodeGame
    tools: [{{name: lookup, fn: "userpkg.game:lookup", schema: {json.dumps(schema)}}}]
    advertise_tools: false
    max_turns: 2
    max_context_tokens: 256
  rollout: {{prompts_per_step: 2, group_size: 4, max_tokens: 4, tasks: 2, log_episodes: 4}}
  generator: {{max_batch_size: 16}}
  trainer: {{optimizer: {{lr: 1.0e-4}}}}
  eval: {{at_start: false, at_end: false, every: 0}}
"""
    )
    return config


def test_a_users_package_trains_through_the_generic_pipeline(tmp_path):
    config = _files(tmp_path)
    run = tmp_path / "run"
    env = script_env(FORGE_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    out = forge_run(["--config", str(config), "--run-dir", str(run)], timeout=280, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("success_rate=nan baseline=nan mean_turns=nan minutes="), last
    assert (run / "rl" / "model" / "config.json").exists()  # the final policy, always
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 2
    assert {"rollout/reward/success", "rollout/reward/brevity"} <= set().union(*steps)
    episodes = [json.loads(x) for x in (run / "rl" / "episodes.jsonl").read_text().splitlines()]
    assert episodes and {"success", "brevity"} <= set(episodes[0]["components"])
    assert all(e["task_id"] and e["messages"][0]["role"] == "user" for e in episodes)
    assert all("green" not in e["messages"][0]["content"] for e in episodes)  # held out
    shown = subprocess.run(
        [sys.executable, "-m", "forge.cli", "episodes", str(run), "--worst", "-n", "2"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert shown.returncode == 0 and "What is the code of" in shown.stdout, shown.stderr
