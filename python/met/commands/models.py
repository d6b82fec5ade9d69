"""`met pull` and `met models`: fetch the default model or one from the Hugging Face Hub, list
what is cached locally (met's own models folder and the Hub cache)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from met.commands.common import CliError, SubParsers, add_command, human_bytes

if TYPE_CHECKING:
    from met.hub import HubRef


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    pull = add_command(subparsers, common, "pull", "download a model into the local cache")
    pull.add_argument(
        "name",
        nargs="?",
        help="user/repo[:QUANT] from the Hugging Face Hub (default: smollm2, the default model)",
    )
    pull.add_argument("--force", action="store_true", help="download even if already present")
    pull.set_defaults(func=_pull)
    listing = add_command(
        subparsers,
        common,
        "models",
        "list the models cached locally (met's and the Hugging Face Hub cache), with sizes",
    )
    listing.set_defaults(func=_list)


class _Progress:
    """Prints download progress on one stderr line, at most a few times a second."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.last_print = 0.0

    def __call__(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - self.last_print < 0.25 and (total is None or done < total):
            return
        self.last_print = now
        speed = done / max(now - self.start, 1e-6)
        of_total = f" / {human_bytes(total)}" if total else ""
        print(
            f"\r  {human_bytes(done)}{of_total}  {human_bytes(speed)}/s   ",
            end="",
            file=sys.stderr,
            flush=True,
        )


def _pull(args: argparse.Namespace) -> int:
    from met.hub import parse_ref

    ref = parse_ref(args.name) if args.name is not None else None
    if ref is not None:
        return _pull_from_hub(ref, args.force)
    from met import models

    if args.name is not None and args.name.lower() not in models.DEFAULT_MODEL_NAMES:
        raise CliError(
            f"unknown model {args.name!r}; `met pull` fetches the default (smollm2) or "
            "user/repo[:QUANT] from the Hugging Face Hub"
        )
    path = models.default_model_path()
    if path.is_file() and not args.force:
        print(f"already present (--force downloads it again): {path}", file=sys.stderr)
    else:
        try:
            path = models.pull_default_model(progress=_Progress())
        except OSError as exc:
            raise CliError(f"cannot pull the default model: {exc}") from exc
        print(file=sys.stderr)
    print(path)
    return 0


def _pull_from_hub(ref: HubRef, force: bool) -> int:
    from met.hub import pull

    try:
        path = pull(ref, force=force)
    except OSError as exc:  # met.hub's errors, one line each
        raise CliError(str(exc)) from exc
    print(path)
    return 0


def _list(args: argparse.Namespace) -> int:
    from met import hub, models

    cached = [*models.list_cached_models(), *hub.cached_models()]
    if not cached:
        print(
            "no models cached; `met pull` fetches the default model, `met pull user/repo[:QUANT]` "
            "one from the Hugging Face Hub",
            file=sys.stderr,
        )
        return 0
    width = max(len(name) for name, _, _ in cached)
    for name, path, size in cached:
        print(f"{name:<{width}}  {human_bytes(size):>10}  {path}")
    return 0
