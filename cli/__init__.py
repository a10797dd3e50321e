"""The `gatehead` command line: one entry point, a subcommand per job, one module per group of them.

Environment variables and flags are read here and nowhere else; subsystems take config objects.
`settings.py` declares the engine's, the agent's and the service's settings once, as flags and
as the variables `gatehead serve` reads.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import gatehead
from gatehead.cli import agent, engine, evals, info, retrieval, serve, training

GROUPS = (info, engine, training, retrieval, agent, serve, evals)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gatehead", description=gatehead.__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"gatehead {gatehead.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_parsers(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # stdout carries results (JSON for `gate`, completions for `generate`); vLLM logs to stdout by default.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        return args.func(args)
    except ValueError as e:  # bad input or config: the message names the fix
        print(f"gatehead {args.command}: error: {e}", file=sys.stderr)
        return 2


