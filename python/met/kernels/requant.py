"""GGUF block formats the C++ kernels do not read, converted at load time into ones they do.

The quantized matmul reads Q8_0, Q4_0 and Q4_1 (32-element blocks). Most GGUF files people run
are K-quants (Q4_K_M: Q4_K with some Q6_K tensors), whose 256-element super-blocks hold 32- or
16-element sub-blocks with their own scales. Rather than dequantizing such a file to float
(4 bytes a weight: a 7B model would need 28 GB), each linear weight is re-expressed in a kernel
format as it is read:

- Q4_K -> Q4_1, almost exactly: a Q4_K sub-block of 32 is w = d * sc * q - dmin * m with q in
  0..15, which is Q4_1's w = q * d' + m' with d' = d * sc and m' = -dmin * m; only d' and m' are
  rounded to float16 (relative error <= 2^-11 of the sub-block's scale). 5 bits a weight
  instead of 4.5.
- every other quantized format (Q6_K, Q5_K, Q5_0, Q5_1, Q3_K, Q2_K) -> Q8_0: dequantized by
  the gguf package, then quantized to int8 per 32-block (error <= 1/254 of the block's largest
  weight, below these formats' own steps of 1/64 or coarser). 8.5 bits a weight.
"""

from __future__ import annotations

import numpy as np

Q4_K_BLOCK_BYTES = 144  # fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
Q4_1_BLOCK_BYTES = 20  # fp16 d, fp16 m, 16 bytes of nibbles


def kernel_format(qtype: str) -> str:
    """The kernel format a GGUF block format is read as."""
    if qtype in ("Q8_0", "Q4_0", "Q4_1"):
        return qtype
    return "Q4_1" if qtype == "Q4_K" else "Q8_0"


def to_kernel_blocks(raw: np.ndarray, qtype: str) -> tuple[np.ndarray, str]:
    """raw [rows, row bytes] of a `qtype` tensor -> (the rows in kernel_format(qtype), its name)."""
    target = kernel_format(qtype)
    if target == qtype:
        return raw, qtype
    if qtype == "Q4_K":
        return q4_k_as_q4_1(raw), target
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    weights = dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32, copy=False)
    return np.ascontiguousarray(quantize(weights, GGMLQuantizationType.Q8_0)), target


def _q4_k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins of each super-block from its 12 packed bytes [..., 12]."""
    low, high = packed[..., 0:4], packed[..., 4:8]
    tail = packed[..., 8:12]
    scales = np.concatenate([low & 63, (tail & 0x0F) | ((low >> 6) << 4)], axis=-1)
    mins = np.concatenate([high & 63, (tail >> 4) | ((high >> 6) << 4)], axis=-1)
    return scales, mins


def q4_k_as_q4_1(raw: np.ndarray) -> np.ndarray:
    """Q4_K rows [rows, n * 144] -> the same weights as Q4_1 rows [rows, n * 8 * 20]."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, Q4_K_BLOCK_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    scales, mins = _q4_k_scales(blocks[..., 4:16])
    # Each 32-byte chunk holds two sub-blocks: low nibbles are sub-block 2c, high ones 2c + 1.
    chunks = blocks[..., 16:].reshape(rows, -1, 4, 32)
    values = np.stack([chunks & 0x0F, chunks >> 4], axis=3).reshape(rows, -1, 8, 32)
    out = np.empty((*values.shape[:3], Q4_1_BLOCK_BYTES), np.uint8)
    out[..., 0:2] = (d[..., None] * scales).astype(np.float16)[..., None].view(np.uint8)
    out[..., 2:4] = (-dmin[..., None] * mins).astype(np.float16)[..., None].view(np.uint8)
    # Q4_1 nibbles: byte i holds element i (low) and element i + 16 (high).
    out[..., 4:] = values[..., :16] | (values[..., 16:] << 4)
    return out.reshape(rows, -1)
