"""Reference quantizers, written from llama.cpp's block layouts, for the GGUF formats the gguf
package cannot quantize to (Q2_K..Q6_K, IQ4_NL, IQ4_XS), so a test can hold real weights in them
(test_cpu_model runs the C++ forward on them against the torch one).

Each follows its format's definition as ggml's dequantize_row_* reads it, with the plain choice
of scales (each sub-block's range over its levels, the super-block's scales quantized against
their largest), not llama.cpp's error-minimizing search: the blocks are valid and close to the
float weights, not the best the format can do. quantize(weights, qtype) returns what
gguf.quants.quantize would: [rows, row bytes] uint8. (GGUF test files keep gguf_writing's random
valid blocks for these formats: real weights put a near-tie into test_moe's tiny router.)
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from met.kernels.cpu_quant import QuantLinear

# ggml's kvalues_iq4nl: IQ4_NL's and IQ4_XS's 16 levels.
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b, 0 where b is 0 (an all-zero sub-block)."""
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, np.float32), where=b != 0)


def _fp16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x as float16 (what the file stores) and that value back as float32."""
    half = x.astype(np.float16)
    return half, half.astype(np.float32)


def _levels(x: np.ndarray, scale: np.ndarray, low: int, high: int) -> np.ndarray:
    return np.clip(np.rint(_div(x, scale)), low, high).astype(np.uint8 if low >= 0 else np.int8)


def _bytes(*parts: np.ndarray) -> np.ndarray:
    """Per super-block, its fields' bytes side by side."""
    return np.concatenate([p.reshape(p.shape[0], -1).view(np.uint8) for p in parts], axis=1)


def _crumbs(q: np.ndarray) -> np.ndarray:
    """2-bit values [n, 256] packed as Q2_K's and Q3_K's qs: block 4n + t in bits 2t, 2t + 1 of
    the 32 bytes at 32n."""
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | q[:, :, 1] << 2 | q[:, :, 2] << 4 | q[:, :, 3] << 6).reshape(-1, 64)


def _q2_k(x: np.ndarray) -> np.ndarray:
    sub = x.reshape(-1, 16, 16)
    low = np.minimum(sub.min(-1), 0)
    scale, mins = (sub.max(-1) - low) / 3, -low
    d16, d = _fp16(scale.max(-1) / 15)
    dmin16, dmin = _fp16(mins.max(-1) / 15)
    sc = _levels(scale, d[:, None], 0, 15)
    mn = _levels(mins, dmin[:, None], 0, 15)
    offset = (dmin[:, None] * mn)[..., None]
    q = _levels(sub + offset, (d[:, None] * sc)[..., None], 0, 3)
    return _bytes(sc | mn << 4, _crumbs(q), d16, dmin16)


def _q3_k(x: np.ndarray) -> np.ndarray:
    sub = x.reshape(-1, 16, 16)
    scale = np.abs(sub).max(-1) / 4
    d16, d = _fp16(scale.max(-1) / 31)
    sc = _levels(scale, d[:, None], 0, 31).astype(np.uint8) + 32  # stored as scale + 32
    level = _levels(sub, (d[:, None] * (sc.astype(np.float32) - 32))[..., None], -4, 3) + 4
    level = level.astype(np.uint8).reshape(-1, 8, 32)  # [block, element]
    hmask = np.zeros((len(x), 32), np.uint8)
    for b in range(8):  # bit b of byte l: element l of block b's third bit
        hmask |= ((level[:, b] >> 2) & 1) << b
    low, high = sc & 0x0F, sc >> 4
    scales = np.concatenate(
        [
            low[:, :8] | low[:, 8:] << 4,
            high[:, 0:4] | high[:, 4:8] << 2 | high[:, 8:12] << 4 | high[:, 12:16] << 6,
        ],
        axis=1,
    )
    return _bytes(hmask, _crumbs(level & 3), scales, d16)


def _q45_k(x: np.ndarray, bits: int) -> np.ndarray:
    sub = x.reshape(-1, 8, 32)
    low = np.minimum(sub.min(-1), 0)
    scale, mins = (sub.max(-1) - low) / ((1 << bits) - 1), -low
    d16, d = _fp16(scale.max(-1) / 63)
    dmin16, dmin = _fp16(mins.max(-1) / 63)
    sc = _levels(scale, d[:, None], 0, 63)
    mn = _levels(mins, dmin[:, None], 0, 63)
    offset = (dmin[:, None] * mn)[..., None]
    q = _levels(sub + offset, (d[:, None] * sc)[..., None], 0, (1 << bits) - 1)
    # get_scale_min_k4's packing: 6 bits each for sub-blocks 0-3, then 4 + 4 + the 2 high bits.
    packed = np.concatenate(
        [
            sc[:, :4] | (sc[:, 4:] >> 4) << 6,
            mn[:, :4] | (mn[:, 4:] >> 4) << 6,
            (sc[:, 4:] & 0x0F) | (mn[:, 4:] & 0x0F) << 4,
        ],
        axis=1,
    )
    nibbles = (q[:, 0::2] & 0x0F) | (q[:, 1::2] & 0x0F) << 4  # pairs of sub-blocks
    if bits == 4:
        return _bytes(d16, dmin16, packed, nibbles)
    qh = np.zeros((len(x), 32), np.uint8)
    for j in range(8):  # bit j of byte l: element l of sub-block j's fifth bit
        qh |= ((q[:, j] >> 4) & 1) << j
    return _bytes(d16, dmin16, packed, qh, nibbles)


def _q6_k(x: np.ndarray) -> np.ndarray:
    sub = x.reshape(-1, 16, 16)
    scale = np.abs(sub).max(-1) / 31
    d16, d = _fp16(scale.max(-1) / 127)
    sc = _levels(scale, d[:, None], -128, 127)
    level = _levels(sub, (d[:, None] * sc)[..., None], -32, 31).astype(np.int16) + 32
    q = level.astype(np.uint8).reshape(-1, 2, 4, 32)  # [half of 128, t, element]
    ql = np.stack(
        [q[:, :, 0] & 15 | (q[:, :, 2] & 15) << 4, q[:, :, 1] & 15 | (q[:, :, 3] & 15) << 4], axis=2
    )
    qh = q[:, :, 0] >> 4 | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4 | (q[:, :, 3] >> 4) << 6
    return _bytes(ql, qh, sc, d16)


def _nearest_iq4(x: np.ndarray) -> np.ndarray:
    return np.abs(x[..., None] - IQ4_VALUES).argmin(-1).astype(np.uint8)


def _iq4_nibbles(index: np.ndarray) -> np.ndarray:
    """[..., 32] level indices as 16 bytes: low nibbles elements 0-15, high ones 16-31."""
    return index[..., :16] | index[..., 16:] << 4


def _iq4_nl(x: np.ndarray) -> np.ndarray:
    blocks = x.reshape(-1, 32)
    # The largest magnitude lands on the level -127.
    peak = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[:, None], -1)[:, 0]
    d16, d = _fp16(peak / -127)
    return _bytes(d16, _iq4_nibbles(_nearest_iq4(_div(blocks, d[:, None]))))


def _iq4_xs(x: np.ndarray) -> np.ndarray:
    sub = x.reshape(-1, 8, 32)
    peak = np.take_along_axis(sub, np.abs(sub).argmax(-1)[..., None], -1)[..., 0]
    scale = peak / -127
    d16, d = _fp16(np.abs(scale).max(-1) / 31)
    ls = (_levels(scale, d[:, None], -32, 31).astype(np.int16) + 32).astype(np.uint16)
    index = _nearest_iq4(_div(sub, (d[:, None] * (ls.astype(np.float32) - 32))[..., None]))
    scales_h = np.zeros(len(x), np.uint16)
    for j in range(8):
        scales_h |= ((ls[:, j] >> 4) & 3) << (2 * j)
    scales_l = (ls[:, 0::2] & 0x0F | (ls[:, 1::2] & 0x0F) << 4).astype(np.uint8)
    return _bytes(d16, scales_h, scales_l, _iq4_nibbles(index))


QUANTIZERS = {
    GGMLQuantizationType.Q2_K: _q2_k,
    GGMLQuantizationType.Q3_K: _q3_k,
    GGMLQuantizationType.Q4_K: lambda x: _q45_k(x, 4),
    GGMLQuantizationType.Q5_K: lambda x: _q45_k(x, 5),
    GGMLQuantizationType.Q6_K: _q6_k,
    GGMLQuantizationType.IQ4_NL: _iq4_nl,
    GGMLQuantizationType.IQ4_XS: _iq4_xs,
}


def quantize(weights: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """weights [..., K] float -> [..., K // block elements * block bytes] uint8 in `qtype`."""
    elements, size = GGML_QUANT_SIZES[qtype]
    rows = weights.astype(np.float32).reshape(-1, elements)
    blocks = QUANTIZERS[qtype](rows)
    assert blocks.shape == (len(rows), size), (qtype, blocks.shape)
    return blocks.reshape(*weights.shape[:-1], -1)


def quant_linear(weight: torch.Tensor, qtype: str) -> QuantLinear:
    """A float [out, in] weight as a QuantLinear in `qtype`: gguf's quantizer where it has one,
    this module's for the others."""
    kind = GGMLQuantizationType[qtype]
    if kind not in QUANTIZERS:
        return QuantLinear.from_float(weight, qtype)
    blocks = quantize(weight.detach().float().numpy(), kind)
    return QuantLinear(torch.from_numpy(np.ascontiguousarray(blocks)), qtype, *weight.shape)
