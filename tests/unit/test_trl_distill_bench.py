"""The pure parts of ``benchmarks.trl_distill``: both systems' teachers read the same prompt,
and the step time is the median of the timed steps."""

import pytest

from benchmarks.trl_distill import DISTILL_YAML, PRIVILEGED, median_step


def test_trls_teacher_prompt_is_the_configs():
    from forge.launch import load_app

    cfg = load_app(DISTILL_YAML, [])[1].rl
    assert cfg.teacher.prompt == PRIVILEGED
    assert (cfg.teacher.model, cfg.teacher.coef, cfg.teacher.discount) == ("policy", 1.0, 0.0)
    # TRL fills {privileged_context} with the target, as Forge fills {target}
    trl = PRIVILEGED.replace("{target}", "{privileged_context}")
    assert trl.format(prompt="Q?", privileged_context="-5") == PRIVILEGED.format(
        prompt="Q?", target="-5"
    )


def test_median_step_leaves_out_the_warmup():
    marks = [0.0, 100.0, 101.0, 103.0, 104.0]  # ends of steps 1..5; step 2 took 100 s
    assert median_step(marks, warmup=1) == 1.0
    assert median_step(marks, warmup=0) == 1.5
    with pytest.raises(RuntimeError, match="warm-up"):
        median_step(marks[:2], warmup=1)
