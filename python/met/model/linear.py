"""A linear weight the model calls one way: a dense tensor, or GGUF blocks kept quantized (in
one format, or row parts in several).

The dense case stays a bare tensor through F.linear, so the dequantized path pays only an
isinstance check per matmul.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from met.kernels.cpu_quant import QuantLinear


class RowParts:
    """One weight whose output rows are its parts' in order, each GGUF blocks in its own format
    (a K-quant file's q/k/v: Q5_0 q and k beside a Q8_0 v), kept as stored: each part is its own
    matmul into its columns of the output."""

    def __init__(self, parts: list[QuantLinear]) -> None:
        self.parts = parts
        self.out_features = sum(p.out_features for p in parts)
        self.in_features = parts[0].in_features

    def __call__(self, x: Tensor) -> Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)

    def dequantize(self) -> Tensor:
        return torch.cat([p.dequantize() for p in self.parts])


Weight = Tensor | QuantLinear | RowParts


def linear(x: Tensor, weight: Weight, bias: Tensor | None = None) -> Tensor:
    if isinstance(weight, Tensor):
        return F.linear(x, weight, bias)
    out = weight(x)
    return out if bias is None else out + bias


def embedding(ids: Tensor, weight: Weight) -> Tensor:
    return F.embedding(ids, weight) if isinstance(weight, Tensor) else weight.rows(ids)


def dense(weight: Weight, dtype: torch.dtype, device: torch.device) -> Tensor:
    if isinstance(weight, QuantLinear | RowParts):
        weight = weight.dequantize()
    return weight.to(device=device, dtype=dtype)


def fuse_rows(parts: list[Weight], dtype: torch.dtype, device: torch.device) -> Weight:
    """One weight whose output rows are the parts' in order: blocks when every part is in the
    same block format, the parts as stored when they are blocks in several (a file may mix
    formats across q/k/v), else dense."""
    if all(isinstance(p, QuantLinear) for p in parts):
        if len({(p.qtype, p.in_features) for p in parts}) == 1:
            return QuantLinear.concat(parts)
        if len({p.in_features for p in parts}) == 1:
            return RowParts(parts)
    return torch.cat([dense(p, dtype, device) for p in parts])
