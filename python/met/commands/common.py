"""Pieces shared by the subcommands: the error type and small formatting helpers."""

from __future__ import annotations

import argparse
import os
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
    """The model file for --model, with a message that says what to do when it is missing."""
    if model and _looks_like_path(model) and not Path(model).expanduser().exists():
        raise CliError(f"model file not found: {model}")
    from met import models

    try:
        return models.resolve_model(model)
    except FileNotFoundError as exc:
        raise CliError(f"model not found: {exc} (run `met pull` for the default model)") from exc


def _looks_like_path(model: str) -> bool:
    return os.sep in model or model.endswith((".gguf", ".safetensors")) or model.startswith(".")


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty() and sys.stdin.isatty()
