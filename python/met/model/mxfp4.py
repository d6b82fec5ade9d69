"""MXFP4 blocks as Hugging Face checkpoints store them (gpt-oss's experts), repacked into the
layout met's quantized matmul reads (GGML type 39, ggml's block_mxfp4).

Both formats hold 32 E2M1 weights per block (sign bit 3, then exponent and mantissa) sharing one
E8M0 scale byte (2^(s - 127)); they differ in where each weight's nibble sits. Hugging Face keeps
blocks [..., rows, G, 16] and scales [..., rows, G] apart, weight 2i in byte i's low nibble and
2i + 1 in its high one (transformers' integrations/mxfp4.py). ggml keeps each block as 17 bytes:
the scale, then weights 0..15 in the low nibbles and 16..31 in the high ones. Repacking moves
nibbles only, so the values are exactly the checkpoint's and a folder's experts take its size.
"""

from __future__ import annotations

import torch
from torch import Tensor


def ggml_mxfp4(blocks: Tensor, scales: Tensor) -> Tensor:
    """blocks uint8 [..., rows, G, 16] and scales uint8 [..., rows, G] -> ggml's block_mxfp4
    rows, uint8 [..., rows, G * 17] (row r's blocks in order along the last axis)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError("MXFP4 blocks and scales are uint8")
    if blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not match"
        )
    # The block's 32 codes in weight order, then the first 16 low and the last 16 high.
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).reshape(*scales.shape, 32)
    nibbles = codes[..., :16] | (codes[..., 16:] << 4)
    packed = torch.cat([scales.unsqueeze(-1), nibbles], dim=-1)
    return packed.reshape(*scales.shape[:-1], -1)
