"""The ``forge`` command line. Subcommands import their heavy dependencies lazily, so
``forge --help`` answers at once.

    forge run --config apps/sumdigits/cpu.yaml [a.b=c ...] [--dry-run]
    forge run --resume runs/sumdigits-20261122-101500 [a.b=c ...]
    forge config show apps/sumdigits/cpu.yaml [a.b=c ...]
    forge top [RUN_DIR] [--once]
    forge episodes RUN_DIR [--step N] [--best | --worst] [-n K] [--disagree N]
    forge eval --config X.yaml [--checkpoint RUN_DIR|MODEL_DIR] [--sets a,b] [a.b=c ...]
    forge export RUN_DIR --merge OUT_DIR
    forge serve [--config serve.yaml] [--preset smollm2|toy] [--host H] [--port P] [--api-key-file FILE]
    forge make-tiny-model DIR [--preset tiny|small|llama] [--seed N]
"""

from __future__ import annotations

import argparse
import sys


def _run(args: argparse.Namespace) -> int:
    from controller._runtime import install_signal_handlers
    from forge.cli.run import run_app

    install_signal_handlers()  # SIGINT/SIGTERM stop the run, even from a background job
    try:
        return run_app(
            args.config,
            args.overrides,
            resume=args.resume,
            run_dir=args.run_dir,
            dry_run=args.dry_run,
        )
    except ValueError as e:  # a config mistake: say it plainly, no traceback
        print(f"forge run: error: {e}", file=sys.stderr)
        return 2


def _config_show(args: argparse.Namespace) -> int:
    from forge.config.describe import show_config
    from forge.launch import load_app

    try:
        _, cfg = load_app(args.config, args.overrides)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"forge config show: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(show_config(cfg))
    return 0


def _make_tiny_model(args: argparse.Namespace) -> int:
    from forge.models import make_tiny_model

    path = make_tiny_model(args.dir, preset=args.preset, seed=args.seed)
    print(f"tiny model ({args.preset}, seed {args.seed}) written to {path}")
    return 0


def _top(args: argparse.Namespace) -> int:
    from forge.cli.top import main as top_main

    try:
        return top_main(args.run_dir, once=args.once, interval=args.interval)
    except ValueError as e:
        print(f"forge top: error: {e}", file=sys.stderr)
        return 2


def _eval(args: argparse.Namespace) -> int:
    from controller._runtime import install_signal_handlers
    from forge.cli.eval import main as eval_main

    install_signal_handlers()
    try:
        return eval_main(args.config, args.checkpoint, args.sets, args.out, args.overrides)
    except ValueError as e:
        print(f"forge eval: error: {e}", file=sys.stderr)
        return 2


def _episodes(args: argparse.Namespace) -> int:
    from forge.observability.episode_log import (
        read_episodes,
        run_decoder,
        select,
        show_episodes,
    )

    try:
        records = read_episodes(args.run_dir)
    except FileNotFoundError as e:
        print(f"forge episodes: error: {e}", file=sys.stderr)
        return 2
    steps = sorted({r["step"] for r in records})
    if args.step is not None and args.step not in steps:
        print(
            f"forge episodes: error: no episodes logged at step {args.step}; steps with "
            f"episodes: {steps[0]}..{steps[-1]}"
            if steps
            else "none",
            file=sys.stderr,
        )
        return 2
    order = "best" if args.best else "worst" if args.worst else None
    chosen = select(records, args.step, order, args.n)
    distilled = args.disagree > 0 and any("distill" in r for r in chosen)
    decode = run_decoder(args.run_dir) if distilled else None
    show_episodes(chosen, disagree=args.disagree, decode=decode)
    return 0


def _export(args: argparse.Namespace) -> int:
    from forge.training.export import export_merged

    try:
        out = export_merged(args.run_dir, args.merge)
    except FileNotFoundError as e:
        print(f"forge export: error: {e}", file=sys.stderr)
        return 2
    print(f"merged policy of {args.run_dir} written to {out}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from controller._runtime import install_signal_handlers
    from forge.serve.server import main as serve_main

    install_signal_handlers()
    try:
        return serve_main(
            args.config, args.host, args.port, args.api_key, args.api_key_file, args.preset
        )
    except (ValueError, ImportError) as e:
        print(f"forge serve: error: {e}", file=sys.stderr)
        return 2


def _models_check(args: argparse.Namespace) -> int:
    from forge.models.check import BatchShape, check_model, format_report

    shape = BatchShape(args.rows, args.prompt_tokens, args.new_tokens)
    try:
        report = check_model(args.model, shape)
    except (ValueError, FileNotFoundError) as e:
        print(f"forge models check: error: {e}", file=sys.stderr)
        return 2
    print(format_report(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="forge", description="Forge: RL post-training for LLMs.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an app from a YAML config")
    run.add_argument("--config", help="the app's YAML config")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")
    run.add_argument("--run-dir", help="where to write outputs (default: runs/<app>-<time>)")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="load and validate the config, print it resolved (as `forge config "
        "show`), start nothing",
    )
    run.add_argument("overrides", nargs="*", metavar="a.b=c", help="config overrides")
    run.set_defaults(fn=_run)
    config = sub.add_parser("config", help="inspect configs without running them")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser(
        "show",
        help="load and validate a config as `forge run` would; print every value with its "
        "default (where it differs) and its doc",
    )
    show.add_argument("config", help="the app's YAML config")
    show.add_argument("overrides", nargs="*", metavar="a.b=c", help="config overrides")
    show.set_defaults(fn=_config_show)
    top = sub.add_parser("top", help="live view of a run: services, replicas, steps, rewards")
    top.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="default: the newest run")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.set_defaults(fn=_top)
    ev = sub.add_parser("eval", help="evaluate a saved policy on a config's evaluation sets")
    ev.add_argument("--config", required=True, help="an RL (or pipeline) run config")
    ev.add_argument("--checkpoint", help="a model directory, or a run directory with one")
    ev.add_argument("--sets", help="comma-separated set names (default: all)")
    ev.add_argument("--out", help="the JSON file (default: <checkpoint>/eval.json)")
    ev.add_argument("overrides", nargs="*", metavar="a.b=c", help="config overrides")
    ev.set_defaults(fn=_eval)
    eps = sub.add_parser("episodes", help="show the episodes a run wrote (what the policy does)")
    eps.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (or its rl stage)")
    eps.add_argument("--step", type=int, help="the step to show (default: the last)")
    which = eps.add_mutually_exclusive_group()
    which.add_argument("--best", action="store_true", help="highest rewards first (all steps)")
    which.add_argument("--worst", action="store_true", help="lowest rewards first (all steps)")
    eps.add_argument("-n", type=int, default=4, help="how many episodes (default 4)")
    eps.add_argument(
        "--disagree",
        type=int,
        default=5,
        metavar="N",
        help="with a distillation teacher: the N tokens where student and teacher logprobs "
        "differ most, per episode (default 5; 0: none)",
    )
    eps.set_defaults(fn=_episodes)
    exp = sub.add_parser("export", help="write a run's final policy as a plain HF model")
    exp.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (or a model directory)")
    exp.add_argument(
        "--merge",
        required=True,
        metavar="OUT_DIR",
        help="where to write the model, LoRA adapters merged into the base",
    )
    exp.set_defaults(fn=_export)
    srv = sub.add_parser("serve", help="serve the Tinker API (LoRA training and sampling)")
    srv.add_argument(
        "--config",
        help="a serve config (docs/tinker.md); with neither --config nor --preset the server "
        "serves smollm2-135m-instruct, the shipped real model (SmolLM2-135M-Instruct)",
    )
    srv.add_argument(
        "--preset",
        choices=("smollm2", "toy"),
        help="the base models to serve: smollm2 (smollm2-135m-instruct, the default) or toy "
        "(forge/tiny, a tiny random-weight model for tests and demos); a --config file "
        "then sets the other knobs",
    )
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000, help="0: any free port")
    srv.add_argument(
        "--api-key",
        help="the key clients must send (default: $FORGE_API_KEY); every local user sees a "
        "command line: prefer the variable or --api-key-file",
    )
    srv.add_argument("--api-key-file", metavar="FILE", help="read the key from FILE (mode 600)")
    srv.set_defaults(fn=_serve)
    models = sub.add_parser("models", help="inspect a model before training it")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    check = models_sub.add_parser(
        "check",
        help="family, tokens, template, precision, memory, a greedy probe and the generator's "
        "logprob parity against the trainer's float32 forward",
    )
    check.add_argument("model", help="a model directory, hub id, GGUF file or shipped name")
    check.add_argument("--rows", type=int, default=64, help="batch rows for the memory estimate")
    check.add_argument("--prompt-tokens", type=int, default=64)
    check.add_argument("--new-tokens", type=int, default=16)
    check.set_defaults(fn=_models_check)
    tiny = sub.add_parser("make-tiny-model", help="build a small HF model + tokenizer locally")
    tiny.add_argument("dir", help="output directory")
    tiny.add_argument("--preset", default="tiny", help="a preset of forge.models.tiny.PRESETS")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(fn=_make_tiny_model)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if argv is None and args.fn in (_run, _eval):  # the command itself, not a call from Python
        from controller.malloc import reexec_tuned

        reexec_tuned()  # its forked zygote gets the actors' malloc settings (returns if it has)
    return args.fn(args)
