"""MXFP4 blocks as Hugging Face checkpoints store them (gpt-oss's experts), read as float.

Each block is 32 E2M1 weights (16 bytes, two per byte: the even-indexed weight in the low
nibble, the odd one in the high) sharing one E8M0 scale byte (2^(s - 127)), as
transformers' integrations/mxfp4.py reads them. GGUF's MXFP4 (GGML type 39) orders the nibbles
differently (the first 16 weights low, the last 16 high); met's quantized matmul reads those
in place. A folder's blocks are dequantized at load: the Hugging Face loader keeps no weight as
blocks (a GGUF file of the model keeps its experts at the file's size).
"""

from __future__ import annotations

import torch
from torch import Tensor

# The E2M1 code points: sign bit 3, then exponent and mantissa.
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_hf_mxfp4(blocks: Tensor, scales: Tensor) -> Tensor:
    """blocks uint8 [..., rows, G, 16] and scales uint8 [..., rows, G] -> float32
    [..., rows, G * 32] (row r's weights in order along the last axis)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError("MXFP4 blocks and scales are uint8")
    if blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not match"
        )
    lut = torch.tensor(E2M1, dtype=torch.float32)
    values = torch.stack([lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], dim=-1)
    values = values.reshape(*blocks.shape[:-1], 32)
    out = torch.ldexp(values, scales.to(torch.int32)[..., None] - 127)
    return out.reshape(*blocks.shape[:-2], -1)
