"""Config you can discover: field docs, `forge config show` and `forge run --dry-run`.

The real command line in a fresh process: tests/checks/test_config_cli.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from forge.config import config_from_dict
from forge.config.describe import field_docs, show_config
from tests.helpers import REPO


@dataclass
class _Inner:
    lr: float = 1e-3
    """The learning rate.

    More detail that a one-line listing leaves out."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    """Adam's betas."""


@dataclass
class _Outer:
    name: str
    """The run's name."""
    steps: int = 10
    """Optimizer steps."""
    inner: _Inner = field(default_factory=_Inner)
    """The optimizer."""
    undocumented: bool = False


@dataclass
class _Derived(_Outer):
    extra: int = 1
    """Only the derived class has it."""


def test_field_docs_reads_attribute_docstrings_including_inherited_ones():
    docs = field_docs(_Derived)
    assert docs["steps"] == "Optimizer steps."
    assert docs["extra"] == "Only the derived class has it."
    assert docs["inner"] == "The optimizer."
    assert docs["name"] == "The run's name."
    assert "undocumented" not in docs
    assert field_docs(_Inner)["lr"].startswith("The learning rate.\n\nMore detail")


def test_show_config_prints_values_defaults_where_they_differ_and_docs():
    cfg = config_from_dict(_Outer, {"name": "x", "steps": 10, "inner": {"lr": 0.5}})
    text = show_config(cfg)
    assert text.splitlines() == [
        "name: x  # required; The run's name.",
        "steps: 10  # Optimizer steps.",  # equal to the default: no default shown
        "inner:  # The optimizer.",
        "  lr: 0.5  # default: 0.001; The learning rate.",  # first paragraph only
        "  betas: [0.9, 0.99]  # Adam's betas.",
        "undocumented: false",
    ]


def test_config_show_in_process_prints_the_tree_and_refuses_a_bad_key(capsys):
    from forge.cli import main

    path = str(REPO / "apps/reinforce/cpu.yaml")
    assert main(["config", "show", path, "steps=3"]) == 0
    out = capsys.readouterr().out
    assert "steps: 3  # default: 100; Training steps." in out
    assert main(["config", "show", path, "checkpoint_every=5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"forge config show: error: invalid config {path}")
    assert "checkpoint_every: unknown key 'checkpoint_every'" in err


def test_config_show_prints_valid_yaml_and_notes_go_to_stderr(capsys):
    """``forge config show X > resolved.yaml`` is a YAML file: every note (``auto``
    precision, a model's conversion) goes to stderr."""
    import yaml

    from forge.cli import main

    for config in ("apps/arith/smollm2.yaml", "apps/sumdigits/cpu.yaml"):
        assert main(["config", "show", str(REPO / config), "rl.generator.dtype=auto"]) == 0
        out = capsys.readouterr().out
        loaded = yaml.safe_load(out)
        assert isinstance(loaded, dict) and "[forge]" not in out
