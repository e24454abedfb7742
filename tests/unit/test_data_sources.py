"""JsonlSource: split fields, rows without targets, chat transcripts; and the built-in
rewards' error for an item without a target."""

from __future__ import annotations

import json

import pytest

from forge.data.sources import JsonlSource
from forge.rewards.exact_match import ExactMatch


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_split_field_decides_what_is_held_out(tmp_path):
    rows = [{"question": f"q{i}", "split": "test" if i % 3 == 0 else "train"} for i in range(9)]
    src = JsonlSource(_write(tmp_path / "d.jsonl", rows), heldout_size=2)
    assert [r["prompt"] for r in src.heldout()] == ["q0", "q3"]  # the first 2 test rows
    train = {src.sample()["prompt"] for _ in range(6)}
    assert train == {"q1", "q2", "q4", "q5", "q7", "q8"}  # never a test row, q6 included
    with pytest.raises(ValueError, match="no row has split='valid'.*splits: \\['test', 'train'\\]"):
        JsonlSource(str(tmp_path / "d.jsonl"), heldout_split="valid")
    # Without the field, the first lines are held out, as before.
    plain = JsonlSource(
        _write(tmp_path / "p.jsonl", [{"prompt": str(i)} for i in range(5)]), heldout_size=2
    )
    assert [r["prompt"] for r in plain.heldout()] == ["0", "1"]


def test_rows_need_no_target_and_transcripts_pass(tmp_path):
    rows = [
        {"prompt": "play", "seed": 3},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
    ]
    src = JsonlSource(_write(tmp_path / "d.jsonl", rows), heldout_size=0)
    got = sorted((src.sample() for _ in range(2)), key=lambda r: "messages" in r)
    assert got[0] == {"prompt": "play", "seed": 3, "target": None}
    assert got[1] == rows[1]
    with pytest.raises(ValueError, match="neither 'question' nor 'prompt'"):
        JsonlSource(_write(tmp_path / "bad.jsonl", [{"text": "x"}]))


def test_rewards_that_need_a_target_say_so():
    with pytest.raises(ValueError, match="exact_match: the item has no target"):
        ExactMatch()("q", "42", None)


def test_the_documented_multi_turn_sft_row_trains(tmp_path):
    """docs/environments.md's transcript example: a valid row whose assistant turns (the
    tool call and the answer) are learned and whose tool result is not."""
    import re

    from forge.data.sft import sft_batch
    from forge.models import load_tokenizer, make_tiny_model
    from tests.helpers import REPO

    doc = (REPO / "docs/environments.md").read_text()
    row = json.loads(re.search(r'```json\n(\{"messages".*?)\n```', doc, re.S).group(1))
    tok = load_tokenizer(str(make_tiny_model(tmp_path / "m", preset="tiny")))
    batch = sft_batch(tok, [row])
    learned = batch.input_ids_bt[0][batch.response_mask_bt[0].bool()].tolist()
    text = tok.decode(learned)
    assert '"name": "lookup"' in text and text.rstrip().endswith("17<|im_end|>")
    assert text.count("17") == 1  # the answer, not the tool's result
