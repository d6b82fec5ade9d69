"""Pieces shared by the subcommands: the error type and small formatting helpers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Protocol


class CliError(Exception):
    """A failure the user can act on; `met` prints it as one line and exits 1."""


class SubParsers(Protocol):
    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_command(
    subparsers: SubParsers,
    common: argparse.ArgumentParser,
    name: str,
    summary: str,
    passthrough: bool = False,
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """A subcommand parser; a pass-through one leaves every argument (even --help) to its owner."""
    if passthrough:
        parser = subparsers.add_parser(name, help=summary, add_help=False)
        parser.set_defaults(passthrough=True)
        return parser
    description = kwargs.pop("description", summary)
    return subparsers.add_parser(
        name, help=summary, description=description, parents=[common], **kwargs
    )


def human_bytes(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def resolve_model_or_fail(model: str | None) -> Path:
    """The model file for --model (the default is pulled if missing), or a CliError saying why."""
    from met import models

    try:
        return models.resolve_model(model)
    except OSError as exc:  # a missing file, or a failed pull of the default model
        raise CliError(str(exc)) from exc


def interactive_terminal() -> bool:
    """A dashboard needs both: a screen to draw on and a keyboard to read."""
    return sys.stdout.isatty() and sys.stdin.isatty()
