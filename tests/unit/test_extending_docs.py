"""The examples of docs/extending.md, run from a package outside the repository.

Each ```python block whose first line is ``# myplugins/<name>.py`` is written into a package
``myplugins`` in a temporary directory put on ``sys.path``; the slots then resolve the doc's
import strings and the results are called for real.
"""

from __future__ import annotations

import re
import sys

import pytest
import torch

from forge.losses import LossConfig, build_loss
from forge.plugins import import_string
from forge.slots import (
    ADVANTAGE,
    DATA_SOURCE,
    ENVIRONMENT,
    GROUP_FILTER,
    REWARD,
    REWARD_AGGREGATOR,
)
from forge.types import Episode
from tests.helpers import REPO

DOC = REPO / "docs" / "extending.md"


def doc_modules() -> dict[str, str]:
    """``{module file name: source}`` for every example block of the doc."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    out = {}
    for block in blocks:
        m = re.match(r"# myplugins/(\w+\.py)\n", block)
        if m:
            out[m.group(1)] = block
    return out


@pytest.fixture
def myplugins(tmp_path, monkeypatch):
    pkg = tmp_path / "myplugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, source in doc_modules().items():
        (pkg / name).write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for mod in [m for m in sys.modules if m == "myplugins" or m.startswith("myplugins.")]:
        del sys.modules[mod]


def test_doc_has_every_example():
    assert set(doc_modules()) >= {"rewards.py", "data.py", "losses.py", "sampling.py", "envs.py"}


def test_reward_examples(myplugins):
    brevity = REWARD.resolve({"fn": "myplugins.rewards:brevity", "kwargs": {"target_len": 2}})
    assert brevity("p", "one two", None) == 1.0
    assert brevity("p", "one two three", None) == pytest.approx(0.5)
    vector = REWARD.resolve("myplugins.rewards:correct_and_short")
    comps = [vector("p", "12", "12"), vector("p", "1 2 3 4 5 6 7 8", "12")]
    assert comps == [{"correct": 1.0, "short": 1.0}, {"correct": 0.0, "short": 0.0}]
    agg = REWARD_AGGREGATOR.resolve(
        {"fn": "weighted_sum", "kwargs": {"weights": {"correct": 1.0, "short": 0.1}}}
    )
    assert agg(comps) == pytest.approx([1.1, 0.0])


def test_data_example(myplugins):
    factory = DATA_SOURCE.resolve(
        {"fn": "myplugins.data:Arithmetic", "kwargs": {"max_value": 9}}, key="data"
    )
    src = factory()
    item = src.sample()
    a, b = map(int, item["prompt"].rstrip("=").split("+"))
    assert a + b == int(item["target"]) and max(a, b) <= 9
    state = src.state_dict()
    nxt = src.sample()
    src.load_state_dict(state)
    assert src.sample() == nxt
    assert len(src.heldout()) == 50 and src.heldout() == factory().heldout()


def test_loss_example(myplugins):
    cfg = LossConfig(type="myplugins.losses:clipped_pg", kwargs={"clip": 0.1})
    loss_fn = build_loss(cfg)
    lp_bt = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)
    gen_bt = torch.tensor([[0.0, -1.0, -2.0]])
    mask_bt = torch.tensor([[0.0, 1.0, 1.0]])
    loss, metrics = loss_fn(
        logprobs_bt=lp_bt,
        generator_logprobs_bt=gen_bt,
        advantages_b=torch.tensor([2.0]),
        mask_bt=mask_bt,
    )
    # ratio 1 everywhere: loss = -A = -2, gradient -A / 2 on each counted token
    assert loss.item() == pytest.approx(-2.0) and metrics["ratio_mean"] == pytest.approx(1.0)
    loss.backward()
    assert lp_bt.grad.tolist() == [[0.0, -1.0, -1.0]]
    with pytest.raises(ValueError, match=r"takes no keyword argument\(s\) \['clipp'\]"):
        LossConfig(type="myplugins.losses:clipped_pg", kwargs={"clipp": 0.1})


def test_sampling_examples(myplugins):
    keep = GROUP_FILTER.resolve("myplugins.sampling:some_success")

    def ep(r: float) -> Episode:
        return Episode("e", [1], [2], [0.0], reward=r, policy_version=0)

    assert keep([ep(0.0), ep(1.0)]) and not keep([ep(0.0), ep(0.0)])
    adv = ADVANTAGE.resolve("myplugins.sampling:centered")
    assert adv(torch.tensor([1.0, 0.0, 3.0, 3.0]), 2).tolist() == [0.5, -0.5, 0.0, 0.0]


def test_slot_errors_name_the_problem(myplugins):
    with pytest.raises(
        ValueError,
        match=r"rewards\[0\]: 'exact_mach' is not a built-in reward "
        r"function \(did you mean 'exact_match'\?\).*built-ins: exact_match",
    ):
        REWARD.resolve("exact_mach", key="rewards[0]")
    with pytest.raises(ValueError, match=r"myplugins.rewards has no attribute 'nope'.*brevity"):
        REWARD.resolve("myplugins.rewards:nope")
    with pytest.raises(
        ValueError,
        match=r"has signature \(group\) -> bool but a reward function is "
        r"called as fn\(prompt, response, target\)",
    ):
        REWARD.resolve("myplugins.sampling:some_success")
    with pytest.raises(ValueError, match=r"lacks the method\(s\) \['sample', 'heldout'\]"):
        DATA_SOURCE.resolve("collections:OrderedDict")


async def test_env_example(myplugins):
    from forge.envs import StepResult, build_env, tool

    make = ENVIRONMENT.resolve("myplugins.envs:Tutor", key="env.fn")
    env = build_env(make)
    assert await env.reset({"prompt": "2+3=", "target": "5"}) == "2+3="
    miss = await env.step("4")
    assert isinstance(miss, StepResult) and not miss.done and miss.observation == "try again"
    hit = await env.step(" 5 ")
    assert hit.done and hit.reward == {"success": 1.0, "speed": 0.5}
    add = tool(import_string("myplugins.envs:add"))
    assert add.spec()["function"]["parameters"]["required"] == ["a", "b"]


async def test_environments_doc_example(tmp_path, monkeypatch):
    """docs/environments.md's complete example plays a game to the end."""
    text = (REPO / "docs" / "environments.md").read_text()
    (block,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)
        if b.startswith("# mygame.py")
    ]
    assert len(block.splitlines()) <= 40
    (tmp_path / "mygame.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    make = ENVIRONMENT.resolve({"fn": "mygame:Guess", "kwargs": {"n": 16}})
    data = DATA_SOURCE.resolve("mygame:Secrets")()
    assert len(data.heldout()) == 16
    env = make()
    assert "1 to 16" in await env.reset({"secret": 11})
    low, high, turns = 1, 16, 0
    while True:  # binary search
        turns += 1
        guess = (low + high) // 2
        r = await env.step(f"{guess}")
        if r.done:
            break
        low, high = (guess + 1, high) if r.observation == "higher" else (low, guess - 1)
    assert r.reward == {"success": 1.0, "turns": pytest.approx(-0.05 * turns)}
    sys.modules.pop("mygame", None)
