"""A step whose every reward is 0 is shown, not hidden: above the progress bar and in the
status ``forge top`` reads."""

from __future__ import annotations

import json

from forge.observability.alerts import RewardAlerts
from forge.observability.names import M
from forge.run.metric_log import MetricLog


def test_all_zero_steps_warn_repeat_and_clear():
    a = RewardAlerts(every=3)
    zero = {M.REWARD: [0.0] * 8, M.reward("math"): [0.0], M.reward("format"): [0.5]}
    first = a.check(1, zero)
    assert first and "every reward was 0 at step 1 (8 episodes" in first
    assert "(components never non-zero: math)," in first  # "format" fired
    assert a.check(2, zero) is None and a.check(3, zero) is None  # not every step
    assert "since step 1" in a.check(4, zero)
    assert "non-zero again at step 5 (all 0 since step 1)" in a.check(5, {M.REWARD: [0, 1.0]})
    assert a.check(6, {M.REWARD: [1.0]}) is None
    assert a.check(7, {}) is None  # no rollouts this step: nothing to say


def test_metric_log_prints_the_warning_and_publishes_it(tmp_path, capsys):
    log = MetricLog(tmp_path, ["jsonl"], steps=3)
    log.add(M.REWARD, [0.0, 0.0])
    log.step(1, {})
    log.add(M.REWARD, [0.0, 1.0])
    log.step(2, {})
    log.close()
    out = capsys.readouterr().out
    assert "[warning] every reward was 0 at step 1" in out
    assert "non-zero again at step 2" in out
    assert any("every reward was 0" in x for x in log.status.fields["alerts"])
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0][M.REWARD] == 0.0


def test_the_warning_shows_two_responses_and_the_prompts_first_token_ids(tmp_path, capsys):
    from forge.observability.episode_log import episode_record
    from forge.types import Episode

    log = MetricLog(tmp_path, ["jsonl"], steps=1)
    said = ["the answer to the answer to", "the answer is the answer", "third"]
    episodes = [Episode(f"e{i}", [9259, 1902, 603], [5, 6], [-1.0, -1.0], 0.0, 0) for i in range(3)]
    conversation = [{"role": "user", "content": "Question: What is 3 plus 5?\nAnswer:"}]
    log.episodes.add(
        [
            episode_record(e, [*conversation, {"role": "assistant", "content": s}])
            for e, s in zip(episodes, said)
        ]
    )
    log.add(M.REWARD, [0.0, 0.0, 0.0])
    log.step(1, {})
    out = capsys.readouterr().out
    assert "response: 'the answer to the answer to'" in out
    assert "response: 'the answer is the answer'" in out and "third" not in out
    assert "prompt starts: 'Question: What is 3 plus 5?\\nAnswer:'" in out
    assert "prompt's first token ids: [9259, 1902, 603]" in out


def test_steps_whose_completions_hit_max_tokens_warn_repeat_and_clear():
    from forge.observability.alerts import TruncationAlerts

    a = TruncationAlerts(share=0.5, every=3)
    assert a.check(1, [1.0, 0.0, 0.0]) is None  # a third: no warning
    first = a.check(2, [1.0, 1.0, 0.0, 1.0])
    assert first and "75% of step 2's completions ended at rollout.max_tokens" in first
    assert a.check(3, [1.0]) is None and a.check(4, [1.0]) is None  # not every step
    assert "since step 2" in a.check(5, [1.0])
    assert "again at step 6 (since 2)" in a.check(6, [0.0, 0.0])
    assert a.check(7, []) is None


def test_metric_log_warns_when_most_completions_are_truncated(tmp_path, capsys):
    log = MetricLog(tmp_path, ["jsonl"], steps=1)
    log.add(M.REWARD, [1.0, 0.0])
    log.add(M.TRUNCATED, [1.0, 1.0])
    log.step(1, {})
    assert "100% of step 1's completions ended at rollout.max_tokens" in capsys.readouterr().out
