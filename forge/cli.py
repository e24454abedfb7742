"""The ``forge`` command line. Subcommands import their heavy dependencies lazily, so
``forge --help`` answers at once.

    forge make-tiny-model DIR [--preset tiny|small|llama] [--seed N]
"""

from __future__ import annotations

import argparse
import sys


def _make_tiny_model(args: argparse.Namespace) -> int:
    from forge.models import make_tiny_model

    path = make_tiny_model(args.dir, preset=args.preset, seed=args.seed)
    print(f"tiny model ({args.preset}, seed {args.seed}) written to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="forge", description="Forge: RL post-training for LLMs.")
    sub = p.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("make-tiny-model", help="build a small HF model + tokenizer locally")
    tiny.add_argument("dir", help="output directory")
    tiny.add_argument("--preset", default="tiny", choices=["tiny", "small", "llama"])
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(fn=_make_tiny_model)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
