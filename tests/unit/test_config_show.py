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


@dataclass
class _Role:
    seed: int = 0
    """The role's seed."""
    transport: _Inner = field(default_factory=_Inner)
    """The role's optimizer."""


@dataclass
class _Run:
    seed: int = 0
    """The run's seed."""
    inner: _Inner = field(default_factory=_Inner)
    """The run's optimizer."""
    role: _Role = field(default_factory=_Role)
    """A role."""
    other: _Role = field(default_factory=_Role)
    """Another role."""

    @classmethod
    def __config_derived__(cls) -> dict[str, str]:
        return {
            "role.seed": "seed",
            "role.transport": "inner",
            "other.seed": "seed",
            "other.transport": "inner",
        }


def test_show_config_marks_derived_keys_holding_their_sources_value():
    run = _Run(seed=3, inner=_Inner(lr=0.5), role=_Role(seed=3, transport=_Inner(lr=0.5)))
    run.other = _Role(seed=4, transport=_Inner(lr=0.25))  # values of its own: knobs
    lines = show_config(run).splitlines()
    role = lines.index("role:  # A role.")
    assert lines[role + 1 : role + 3] == ["  seed: 3  # = seed", "  # transport: = inner"]
    other = lines.index("other:  # Another role.")
    assert lines[other + 1].startswith("  seed: 4  # default: 0; The role's seed.")
    assert lines[other + 2] == "  transport:  # The role's optimizer."
    assert lines[other + 3].startswith("    lr: 0.25  # default: 0.001; ")


def test_config_show_marks_every_copied_key_and_its_yaml_loads_to_the_same_config(capsys, tmp_path):
    """``forge config show X > resolved.yaml``: a copied key (each role's seed, the roles'
    model, temperature and weight transport) names the key it follows, and the printed
    text, loaded as a config, is the config that was shown."""
    from forge.cli import main
    from forge.config import config_to_dict
    from forge.launch import load_app

    config = REPO / "apps/sumdigits/cpu.yaml"
    assert main(["config", "show", str(config), "seed=3"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    rl = lines.index(next(line for line in lines if line.startswith("rl:")))
    rl_lines = lines[rl:]
    assert "  seed: 3  # = seed" in rl_lines  # the stage's seed
    for role in ("trainer", "generator"):
        start = rl_lines.index(next(x for x in rl_lines if x.startswith(f"  {role}:")))
        body = rl_lines[start + 1 :]
        body = body[: next(i for i, x in enumerate(body) if not x.startswith("    "))]
        assert "    seed: 3  # = seed" in body, role
        assert "    model: from-run  # = rl.policy.model" in body, role
        assert "    # weights: = rl.weights" in body, role
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(out)
    _, shown = load_app(config, ["seed=3"])
    _, loaded = load_app(resolved, [])
    assert config_to_dict(loaded) == config_to_dict(shown)
