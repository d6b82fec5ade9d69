"""Whether torchrun (or a user with its variables) started this process as one of several
ranks; kept free of torch so the server can ask before it loads anything."""

from __future__ import annotations

import os


def launched_rank() -> tuple[int, int] | None:
    """(RANK, WORLD_SIZE) when this process is one rank of a multi-process group, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or "RANK" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
