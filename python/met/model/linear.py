"""A linear weight the model calls one way: a dense tensor, or GGUF blocks kept quantized.

The dense case stays a bare tensor through F.linear, so the dequantized path pays only an
isinstance check per matmul.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from met.kernels.cpu_quant import QuantLinear

Weight = Tensor | QuantLinear


def linear(x: Tensor, weight: Weight, bias: Tensor | None = None) -> Tensor:
    if isinstance(weight, Tensor):
        return F.linear(x, weight, bias)
    out = weight(x)
    return out if bias is None else out + bias


def embedding(ids: Tensor, weight: Weight) -> Tensor:
    return F.embedding(ids, weight) if isinstance(weight, Tensor) else weight.rows(ids)


def dense(weight: Weight, dtype: torch.dtype, device: torch.device) -> Tensor:
    if isinstance(weight, QuantLinear):
        weight = weight.dequantize()
    return weight.to(device=device, dtype=dtype)


def fuse_rows(parts: list[Weight], dtype: torch.dtype, device: torch.device) -> Weight:
    """One weight whose output rows are the parts' in order; quantized when every part is in
    the same block format, else dense (a file may mix formats across q/k/v)."""
    if all(isinstance(p, QuantLinear) for p in parts):
        formats = {(p.qtype, p.in_features) for p in parts}
        if len(formats) == 1:
            return QuantLinear.concat(parts)
    return torch.cat([dense(p, dtype, device) for p in parts])
