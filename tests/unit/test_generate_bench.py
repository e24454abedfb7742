"""The pure parts of ``benchmarks.generate``: how ``hf_generate``'s tokens are counted, the
per-model defaults and the flags that would be ignored."""

import pytest
import torch

from apps.arith.task import INSTRUCTION, Addition
from benchmarks.generate import _counted_tokens, parse_args, prompts


def test_counted_tokens_stop_at_the_first_eos_and_include_it():
    eos, pad = 2, 2  # SmolLM2: pad is eos, so a count of non-pad tokens would drop the eos
    new_bt = torch.tensor(
        [
            [5, 6, eos, pad, pad],  # 3: two tokens and the eos
            [eos, pad, pad, pad, pad],  # 1: the eos alone
            [5, 6, 7, 8, 9],  # 5: no eos, max_new_tokens reached
            [5, 7, 6, 9, 0],  # 5 with eos {2}; 4 when 9 is an eos id too
        ]
    )
    assert _counted_tokens(new_bt, {eos}) == 3 + 1 + 5 + 5
    assert _counted_tokens(new_bt, {eos, 9}) == 3 + 1 + 5 + 4  # 9 ends row 3 at its 4th token


def test_smollm2_defaults_are_the_main_jobs_batch_and_the_tiny_ones_unchanged():
    real = parse_args(["--model", "smollm2"])
    assert (real.prompts, real.n, real.max_tokens, real.dtype) == (8, 8, 16, "bfloat16")
    assert real.backends == ["hf", "hf_generate", "vllm"] and real.threads == 2
    tiny = parse_args([])
    assert (tiny.prompts, tiny.n, tiny.max_tokens, tiny.dtype) == (32, 4, 64, "float32")
    assert tiny.backends == ["hf", "vllm"] and tiny.threads == 0  # not pinned, as before
    # The chat prompts are the main job's first questions (Addition(digits=2, seed=0)).
    data = Addition(digits=2, seed=0)
    assert prompts(8, real.style) == [data.sample()["prompt"] for _ in range(8)]
    assert prompts(1, real.style)[0][0]["content"].endswith(INSTRUCTION)


@pytest.mark.parametrize(
    "argv",
    [
        ["--backends", "hf,trl"],
        ["--threads", "-1"],
        ["--backends", "hf,hf_generate", "--update"],
        ["--backends", "hf_generate", "--max-batch-size", "16"],
    ],
)
def test_flags_that_would_be_ignored_or_unknown_are_errors(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)
