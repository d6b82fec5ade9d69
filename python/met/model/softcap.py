"""Attention with tanh soft-capped scores (Gemma 2), which SDPA has no option for."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def softcapped_attention(
    q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, scale: float | None, cap: float
) -> Tensor:
    """SDPA's contract (q [..., n_q, dim], keys/values [..., n_k, dim], additive mask) with the
    scores squashed to cap * tanh(score / cap) before the mask and softmax."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / cap) * cap + mask
    return torch.matmul(torch.softmax(scores, dim=-1), values)
