"""Rotate-half RoPE: the cos/sin tables a model precomputes and the rotation itself."""

from __future__ import annotations

import torch
from torch import Tensor

from met.model.config import ModelConfig


def rope_table(
    config: ModelConfig,
    max_positions: int,
    local: bool,
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int | None = None,
) -> tuple[Tensor, Tensor]:
    """cos and sin [max_positions, 1, head_dim / 2] (broadcast over the heads of a [T, heads,
    dim] tensor); local: the sliding layers' own base (Gemma 3); head_dim: a layer's own
    (Gemma 4), default the config's."""
    inv_freq = torch.tensor(config.inv_freq(local, head_dim), dtype=torch.float64)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    scale = config.rope_attn_factor  # Phi-3's LongRoPE magnitude, 1 elsewhere
    cos = (angles.cos() * scale).to(device, dtype)[:, None, :]
    return cos, (angles.sin() * scale).to(device, dtype)[:, None, :]


def rotate_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Pair i of each head is (x[i], x[i + dim / 2]); with partial RoPE (tables narrower than
    half the head) only the first 2 * cos.shape[-1] dims rotate, the rest pass through."""
    if 2 * cos.shape[-1] < x.shape[-1]:
        rotated = 2 * cos.shape[-1]
        return torch.cat((rotate_half(x[..., :rotated], cos, sin), x[..., rotated:]), dim=-1)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
