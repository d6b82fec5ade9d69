"""`met trace`: replay a scenario through the core and print the scheduler's decisions."""

from __future__ import annotations

import argparse

from met.commands.common import SubParsers, add_command


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    parser = add_command(
        subparsers,
        common,
        "trace",
        "replay a scenario (FILE or a built-in such as batched_mixed) step by step",
        epilog="A malformed scenario exits 2 with one line naming the bad key.",
    )
    parser.add_argument("scenario", help="a scenario .toml file, or batched_mixed")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from met.trace import trace_main

    return trace_main([args.scenario])
