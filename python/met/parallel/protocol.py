"""What rank 0 tells the other ranks: a fixed-size int64 header, then an optional payload.

Every message is two broadcasts at most (header, payload), so a worker always knows how much to
receive next. The EP words are the scheduler's own (trace spec section 7); forwards carry the
packed inputs, block tables included, so a worker runs exactly the forward rank 0 runs.
"""

from __future__ import annotations

from enum import IntEnum

import torch
from torch import Tensor

HEADER_LEN = 5  # kind, a, b, payload length, spare

EP_PREFILL = 0xFFFFFFF0  # followed by (chunk length, chunk start, prompt length) and the prompt
EP_FREE = 0xFFFFFFF1  # the slot was released
EP_SHUTDOWN = 0xFFFFFFFF


class Kind(IntEnum):
    SEQ_WORD = 1  # ep_broadcast_cmd_for_seq: a = slot, b = command word
    WORD = 2  # ep_broadcast_cmd: a = word
    TOKENS = 3  # ep_broadcast_tokens: payload = the tokens
    FORWARD = 4  # payload = packed forward inputs; a = tokens, b = rows
    PING = 5  # liveness while idle; answered by a one-element all-reduce


# Packed in this order; the block tables last, as their width follows from the payload length.
_FORWARD_FIELDS = ("input_ids", "positions", "slot_mapping", "seq_lens", "cu_seqlens")


def header(kind: Kind, a: int = 0, b: int = 0, payload_len: int = 0) -> Tensor:
    return torch.tensor([int(kind), a, b, payload_len, 0], dtype=torch.int64)


def pack_forward(inputs: dict[str, Tensor]) -> tuple[int, int, Tensor]:
    """(tokens, rows, payload) of one forward's inputs, as a single int64 tensor."""
    fields = [*_FORWARD_FIELDS, "block_tables"]
    parts = [inputs[name].reshape(-1).to(torch.int64) for name in fields]
    return inputs["input_ids"].numel(), inputs["seq_lens"].numel(), torch.cat(parts)


def unpack_forward(n_tok: int, n_rows: int, payload: Tensor, device: torch.device) -> dict:
    """The model.forward keyword arguments of a packed forward, with no logits rows: only rank 0
    samples, so the other ranks skip the LM head."""
    sizes = [n_tok] * 3 + [n_rows, n_rows + 1]
    width_total = payload.numel() - sum(sizes)
    pieces = list(payload.to(device).split([*sizes, width_total]))
    as_int = torch.int32
    return {
        "input_ids": pieces[0],
        "positions": pieces[1],
        "slot_mapping": pieces[2],
        "seq_lens": pieces[3].to(as_int),
        "cu_seqlens": pieces[4].to(as_int),
        "block_tables": pieces[5].view(n_rows, -1).to(as_int),
        "logits_rows": torch.empty(0, dtype=torch.int64, device=device),
    }
