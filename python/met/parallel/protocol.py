"""What rank 0 tells the other ranks: a fixed-size int64 header, then an optional payload.

Every message is two broadcasts at most (header, payload), so a worker always knows how much to
receive next. A forward travels as the rows of the scheduler's step plan, serialized once: each
row's sequence (the request id), start, prompt length, tokens and block table, from which a
worker packs exactly the inputs rank 0 packs (forward_rows.pack_rows). A released sequence and
the shutdown are messages of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch
from torch import Tensor

HEADER_LEN = 5  # kind, a, b, payload length, spare
_ROW_HEAD = 5  # per row: sequence, start, prompt length, tokens, blocks


class Kind(IntEnum):
    PLAN = 1  # a forward's rows; a = rows
    FREE = 2  # a = the sequence rank 0 released
    SHUTDOWN = 3
    PING = 4  # liveness while idle; answered by a one-element all-reduce


@dataclass
class PlannedRow:
    """One row of a forward as a worker receives it."""

    seq: int
    start: int
    prompt_len: int
    tokens: list[int]
    table: list[int]


def header(kind: Kind, a: int = 0, b: int = 0, payload_len: int = 0) -> Tensor:
    return torch.tensor([int(kind), a, b, payload_len, 0], dtype=torch.int64)


def pack_plan(rows: list[PlannedRow]) -> Tensor:
    """The rows as one int64 tensor: each row's head, then its tokens and its block table."""
    flat: list[int] = []
    for row in rows:
        flat += [row.seq, row.start, row.prompt_len, len(row.tokens), len(row.table)]
        flat += row.tokens
        flat += row.table
    return torch.tensor(flat, dtype=torch.int64)


def unpack_plan(n_rows: int, payload: Tensor) -> list[PlannedRow]:
    """pack_plan's rows back; a ValueError if the payload does not hold them exactly."""
    flat, rows, at = payload.tolist(), [], 0
    for _ in range(n_rows):
        if at + _ROW_HEAD > len(flat):
            raise ValueError(f"a plan of {n_rows} rows ends inside row {len(rows)}")
        seq, start, prompt_len, n_tokens, n_blocks = flat[at : at + _ROW_HEAD]
        at += _ROW_HEAD
        tokens, table = flat[at : at + n_tokens], flat[at + n_tokens : at + n_tokens + n_blocks]
        at += n_tokens + n_blocks
        rows.append(PlannedRow(seq, start, prompt_len, tokens, table))
    if at != len(flat):
        raise ValueError(f"a plan of {n_rows} rows has {len(flat) - at} values left over")
    return rows
