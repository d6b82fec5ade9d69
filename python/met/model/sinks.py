"""Attention sinks (gpt-oss): a learned logit per query head that joins the softmax's
denominator and carries no value, so a head can attend to nothing.

SDPA has no option for them; they are one more key column instead: a zero key (its score is 0)
with a zero value, the mask adding the head's sink logit to that column's score. Softmax over
[scores, sink] then weights the real values exactly as exp(s_j) / (sum exp(s) + exp(sink)).
"""

from __future__ import annotations

import torch
from torch import Tensor


def with_sink_column(
    keys: Tensor, values: Tensor, mask: Tensor, sinks: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """keys/values [..., n_k, dim] and an additive mask [..., n_q, n_k] with the sink column
    appended (keys/values [..., n_k + 1, dim], mask [..., n_q, n_k + 1]); sinks [..., n_q]
    holds the logit of each query row's head, broadcast like the mask's leading dimensions."""
    zero = keys.new_zeros(*keys.shape[:-2], 1, keys.shape[-1])
    keys = torch.cat([keys, zero], dim=-2)
    values = torch.cat([values, zero.to(values.dtype)], dim=-2)
    rows = torch.broadcast_shapes(mask.shape[:-1], sinks.shape)
    column = sinks.to(mask.dtype)[..., None].expand(*rows, 1)
    mask = torch.cat([mask.expand(*rows, mask.shape[-1]), column], dim=-1)
    return keys, values, mask


def grouped_sinks(sinks: Tensor, groups: int, n_q: int) -> Tensor:
    """[1, n_kv_heads, groups * n_q]: the sink of each query row of a grouped-query prefill,
    where row g * n_q + i of KV head h is query i of head h * groups + g."""
    per_head = sinks.view(-1, groups, 1).expand(-1, -1, n_q)
    return per_head.reshape(1, -1, groups * n_q)
