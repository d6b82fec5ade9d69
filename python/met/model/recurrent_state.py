"""The recurrent layers' state of a hybrid model (Qwen3.5 / Qwen3-Next, model/deltanet.py) per
sequence slot, beside the paged KV pool: what a slot holds, what a verify row keeps per token,
and the checkpoints a prefix cache resumes from (engine/hybrid.py decides which to keep)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from met.model.config import RecurrentShape


@dataclass
class RecurrentState:
    """Every recurrent layer's state per slot: conv [layers, slots, conv_dim, kernel - 1] (the
    last kernel - 1 inputs of the conv, in the model dtype) and delta [layers, slots, v_heads,
    k_dim, v_dim] (float32). A verify row (speculation) keeps the state after each of its
    tokens in snap_conv / snap_delta [layers, slots, tokens, ...], so that the state as of its
    last accepted token can be put back (restore). A forward may also write a row's state as of
    a given position into checkpoint `index`: ckpt_conv / ckpt_delta [checkpoints, layers, ...]
    (keep_checkpoints allocates them), which restore_checkpoint copies into a slot."""

    conv: Tensor
    delta: Tensor
    snap_conv: Tensor | None = None
    snap_delta: Tensor | None = None
    ckpt_conv: Tensor | None = None
    ckpt_delta: Tensor | None = None

    @classmethod
    def allocate(
        cls,
        shape: RecurrentShape,
        n_layers: int,
        n_slots: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> RecurrentState:
        conv = (n_layers, n_slots, shape.conv_dim, shape.kernel - 1)
        delta = (n_layers, n_slots, shape.v_heads, shape.k_dim, shape.v_dim)
        return cls(
            torch.zeros(conv, dtype=dtype, device=device),
            torch.zeros(delta, dtype=torch.float32, device=device),
        )

    @property
    def n_slots(self) -> int:
        return self.conv.shape[1]

    def keep_snapshots(self, depth: int) -> None:
        """Room for `depth` tokens' states per slot (allocated on the first verify row)."""
        if self.snap_conv is None or self.snap_conv.shape[2] < depth:
            layers, slots = self.conv.shape[:2]
            self.snap_conv = self.conv.new_zeros(layers, slots, depth, *self.conv.shape[2:])
            self.snap_delta = self.delta.new_zeros(layers, slots, depth, *self.delta.shape[2:])

    def restore(self, slot: int, tokens: int) -> None:
        """Slot `slot`'s state as it was after the first `tokens` tokens of its last verify row
        (the draft tokens after them were rejected)."""
        self.conv[:, slot] = self.snap_conv[:, slot, tokens - 1]
        self.delta[:, slot] = self.snap_delta[:, slot, tokens - 1]

    def reset(self, slots: list[int]) -> None:
        """Zero the slots' state: a sequence starting at position 0 has seen nothing."""
        if slots:
            index = torch.tensor(slots, device=self.conv.device)
            self.conv[:, index] = 0
            self.delta[:, index] = 0

    def keep_checkpoints(self, count: int) -> None:
        """Room for `count` checkpoints (each one sequence's state over every layer)."""
        if self.ckpt_conv is None:
            self.ckpt_conv = self.conv.new_zeros(count, *self.conv[:, 0].shape)
            self.ckpt_delta = self.delta.new_zeros(count, *self.delta[:, 0].shape)

    def checkpoint(self, index: int, slot: int, token: int | None = None) -> None:
        """Checkpoint `index` takes slot `slot`'s state: as it is now, or as it was after
        `token` of its last verify row."""
        if token is None:
            self.ckpt_conv[index] = self.conv[:, slot]
            self.ckpt_delta[index] = self.delta[:, slot]
        else:
            self.ckpt_conv[index] = self.snap_conv[:, slot, token]
            self.ckpt_delta[index] = self.snap_delta[:, slot, token]

    def restore_checkpoint(self, index: int, slot: int) -> None:
        """Slot `slot` resumes from checkpoint `index`."""
        self.conv[:, slot] = self.ckpt_conv[index]
        self.delta[:, slot] = self.ckpt_delta[index]


def state_bytes(shape: RecurrentShape, n_layers: int, dtype: torch.dtype) -> int:
    """One sequence's recurrent state over `n_layers` recurrent layers, in bytes."""
    conv = shape.conv_dim * (shape.kernel - 1) * torch.empty((), dtype=dtype).element_size()
    delta = shape.v_heads * shape.k_dim * shape.v_dim * 4
    return n_layers * (conv + delta)
