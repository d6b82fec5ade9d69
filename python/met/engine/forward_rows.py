"""The rows of one packed forward, as TorchBackend builds them from the scheduler's StepPlan,
and their packing into the flat tensors of met's paged model forward."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from met import _core


@dataclass
class Row:
    """One row of a packed forward: `tokens` written at positions start.. of `seq`. A draft
    row's tokens are not final until the scheduler says how many stand (commit_accepted_prefix),
    so its blocks are not hashed into the prefix cache before that."""

    seq: _core.Sequence
    tokens: list[int]
    start: int
    draft: bool = False


def plan_rows(plan: _core.StepPlan) -> tuple[list[Row], list[list[int]], int]:
    """The rows of a StepPlan, their block tables (the scheduler grew them to cover the rows),
    and how many of them (its verify rows, first) take a logits row per position."""
    rows, tables, spread = [], [], 0
    for r in plan.rows:
        seq = r.seq
        rows.append(Row(seq, r.tokens, r.start, r.draft > 0))
        tables.append(seq.block_table)
        spread += r.kind == _core.RowKind.Verify
    return rows, tables, spread


class Positioned(Protocol):
    """What packing reads of a row: its tokens and where they start (a Row, or the row a
    tensor-parallel worker receives)."""

    tokens: list[int]
    start: int


def pack_rows(
    rows: Sequence[Positioned],
    tables: list[list[int]],
    block_size: int,
    device: torch.device,
    spread: int = 0,
) -> dict[str, torch.Tensor]:
    """Packs variable-length rows into the flat tensors of one batched paged forward; the
    first `spread` rows get a logits row per position, the others one for their last."""
    ids, positions, slots, query_lens = [], [], [], []
    for row, table in zip(rows, tables, strict=True):
        span = range(row.start, row.start + len(row.tokens))
        ids.extend(row.tokens)
        positions.extend(span)
        slots.extend(table[p // block_size] * block_size + p % block_size for p in span)
        query_lens.append(len(row.tokens))
    width = max(len(t) for t in tables)
    padded = [t + [0] * (width - len(t)) for t in tables]
    cu = [0]
    for n in query_lens:
        cu.append(cu[-1] + n)
    as_long = {"dtype": torch.int64, "device": device}
    as_int = {"dtype": torch.int32, "device": device}
    return {
        "input_ids": torch.tensor(ids, **as_long),
        "positions": torch.tensor(positions, **as_long),
        "slot_mapping": torch.tensor(slots, **as_long),
        "block_tables": torch.tensor(padded, **as_int),
        "seq_lens": torch.tensor([r.start + len(r.tokens) for r in rows], **as_int),
        "cu_seqlens": torch.tensor(cu, **as_int),
        "logits_rows": torch.tensor(
            list(range(cu[spread])) + [c - 1 for c in cu[spread + 1 :]], **as_long
        ),
    }
