"""The episode sample of a run: records, the per-step file, selection and rendering."""

from __future__ import annotations

import io

import pytest

from forge.cli import main
from forge.observability.episode_log import (
    EpisodeSamples,
    episode_record,
    read_episodes,
    select,
    show_episodes,
)
from forge.types import Episode


def _episode(reward: float, version: int = 3) -> Episode:
    e = Episode(
        "e",
        [1],
        [2, 3],
        [0.0, 0.0],
        reward=reward,
        policy_version=version,
        group_id="g1",
        advantage=reward - 0.5,
        target={"key": object()},
        reward_breakdown={"success": reward},
        stop_reason="done",
    )
    e.turn_rewards = [0.0, {"success": reward}]
    return e


def test_records_are_written_per_step_and_selected(tmp_path):
    samples = EpisodeSamples(tmp_path)
    chat = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "b"},
    ]
    assert samples.room(3) == 3
    samples.add([episode_record(_episode(r), chat, 2) for r in (0.0, 1.0)])
    assert samples.room(3) == 1 and samples.room(2) == 0
    samples.write(5)
    samples.write(6)  # nothing pending: nothing written
    samples.add([episode_record(_episode(0.5), chat)])
    samples.write(7)
    records = read_episodes(tmp_path)
    assert [(r["step"], r["reward"]) for r in records] == [(5, 0.0), (5, 1.0), (7, 0.5)]
    assert records[0]["target"].startswith("{'key': <object")  # not JSON: its repr
    assert records[0]["turn_rewards"] == [0.0, {"success": 0.0}]
    assert [r["reward"] for r in select(records, None, None, 5)] == [0.5]  # the last step
    assert [r["reward"] for r in select(records, None, "best", 2)] == [1.0, 0.5]
    assert [r["reward"] for r in select(records, 5, "worst", 1)] == [0.0]
    from rich.console import Console

    out = io.StringIO()
    show_episodes(records[:2], Console(file=out, width=100))
    text = out.getvalue()
    assert "step 5 · v3 · reward 1.000" in text and "turn reward success=1" in text
    assert "assistant: b" in text and "success=1 · target:" in text


def test_the_command_names_what_is_missing(tmp_path, capsys):
    assert main(["episodes", str(tmp_path)]) == 2
    assert "no episodes.jsonl in" in capsys.readouterr().err
    samples = EpisodeSamples(tmp_path / "rl")  # the directory is made on the first write
    samples.add([episode_record(_episode(1.0), [{"role": "user", "content": "q"}])])
    samples.write(4)
    assert main(["episodes", str(tmp_path), "--step", "9"]) == 2
    assert "steps with episodes: 4..4" in capsys.readouterr().err
    assert main(["episodes", str(tmp_path)]) == 0
    with pytest.raises(SystemExit):
        main(["episodes", str(tmp_path), "--best", "--worst"])


def test_a_distilled_episode_shows_where_student_and_teacher_disagree_most(tmp_path, capsys):
    from forge.models import make_tiny_model
    from forge.models.loading import load_tokenizer
    from forge.observability.episode_log import disagreements

    model = make_tiny_model(tmp_path / "model", seed=0)
    tok = load_tokenizer(str(model))
    ids = [tok.convert_tokens_to_ids(c) for c in "abcd"]
    e = Episode("e", [1], ids, [-1.0, -0.5, -3.0, -0.2], reward=0.0, policy_version=1)
    e.teacher_logprobs = [-1.1, -4.5, -0.5, -0.2]  # |diff|: 0.1, 4.0, 2.5, 0.0
    record = episode_record(e, [{"role": "assistant", "content": "abcd"}])
    assert record["distill"]["teacher"] == e.teacher_logprobs
    assert disagreements(record, 2) == [(1, ids[1], -0.5, -4.5), (2, ids[2], -3.0, -0.5)]
    assert disagreements(episode_record(_episode(1.0), []), 2) == []  # no teacher: none
    samples = EpisodeSamples(tmp_path)
    samples.add([record])
    samples.write(3)
    (tmp_path / "config.yaml").write_text(f"policy: {{model: {model}}}\n")
    assert main(["episodes", str(tmp_path), "--disagree", "2"]) == 0
    out = capsys.readouterr().out
    assert "disagree most" in out
    rows = [line for line in out.splitlines() if "'b'" in line or "'c'" in line]
    assert len(rows) == 2 and "+4.000" in rows[0] and "-2.500" in rows[1], out
    assert "'a'" not in out.split("disagree most")[1]  # only the 2 largest
    assert main(["episodes", str(tmp_path), "--disagree", "0"]) == 0
    assert "disagree most" not in capsys.readouterr().out
