"""Linear layers on GGUF-quantized weights for the CPU: met._core.cpu.quant_matmul over tensors.

A QuantLinear keeps a weight's GGUF block bytes (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, IQ4_NL,
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS, as the file stores them) as a uint8 tensor and
multiplies fp32 activations against them without dequantizing; activations are quantized to
int8 per 32-element block inside the kernel, so results differ from the dequantized float
matmul by about 1e-3 relative.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from met import _core

QTYPES = (
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "MXFP4",
    "IQ4_NL",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_XS",
)


class QuantLinear:
    """y = x @ W^T with W [out_features, in_features] held as GGUF blocks, row after row."""

    def __init__(self, blocks: Tensor, qtype: str, out_features: int, in_features: int) -> None:
        if qtype not in QTYPES:
            raise ValueError(f"qtype must be one of {QTYPES}, not {qtype!r}")
        unit = _core.cpu.block_elements(qtype)
        if in_features % unit:
            raise ValueError(f"{qtype} needs in_features a multiple of {unit}, got {in_features}")
        expected = out_features * _core.cpu.row_bytes(qtype, in_features)
        if blocks.dtype != torch.uint8 or blocks.device.type != "cpu":
            raise ValueError("blocks must be a CPU uint8 tensor")
        if blocks.numel() != expected:
            raise ValueError(
                f"{qtype} [{out_features}, {in_features}] needs {expected} bytes, "
                f"got {blocks.numel()}"
            )
        self.blocks = blocks.contiguous().reshape(out_features, -1)
        self.qtype = qtype
        self.out_features = out_features
        self.in_features = in_features

    @classmethod
    def from_float(cls, weight: Tensor, qtype: str) -> QuantLinear:
        """Quantize a float [out, in] weight with gguf's reference quantizer (which has none for
        the K-quants: ValueError)."""
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        array = weight.detach().float().cpu().numpy()
        try:
            packed = quantize(array, GGMLQuantizationType[qtype])
        except NotImplementedError as exc:
            raise ValueError(f"gguf has no quantizer for {qtype}: {exc}") from exc
        return cls(torch.from_numpy(np.ascontiguousarray(packed)), qtype, *weight.shape)

    def dequantize(self) -> Tensor:
        """The float weight these blocks stand for (gguf's reading of the format)."""
        array = _dequantize(self.blocks.numpy(), self.qtype)
        return torch.from_numpy(np.ascontiguousarray(array)).reshape(
            self.out_features, self.in_features
        )

    @classmethod
    def concat(cls, parts: list[QuantLinear]) -> QuantLinear:
        """Stack the output rows of weights sharing a format and an input width: GGUF rows are
        self-contained runs of blocks along K, so row concatenation is exact."""
        first = parts[0]
        if any((p.qtype, p.in_features) != (first.qtype, first.in_features) for p in parts):
            raise ValueError("concat needs one qtype and one in_features across the parts")
        blocks = torch.cat([p.blocks for p in parts])
        return cls(blocks, first.qtype, blocks.shape[0], first.in_features)

    def rows(self, ids: Tensor) -> Tensor:
        """Float32 rows [len(ids), in_features]: an embedding lookup that dequantizes only the
        rows it reads, so a tied embedding needs no float copy of the table."""
        picked = self.blocks[ids.cpu()].numpy()
        array = _dequantize(picked, self.qtype)
        return torch.from_numpy(np.ascontiguousarray(array)).reshape(-1, self.in_features)

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def __call__(self, x: Tensor, n_threads: int | None = None, isa: str = "auto") -> Tensor:
        """x [..., in_features] fp32 on the CPU -> [..., out_features] fp32."""
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"x must be a CPU float32 tensor, got {x.dtype} on {x.device}")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x has {x.shape[-1]} features, the weight takes {self.in_features}")
        flat = x.reshape(-1, self.in_features).contiguous()
        out = torch.empty(flat.shape[0], self.out_features, dtype=torch.float32)
        threads = torch.get_num_threads() if n_threads is None else n_threads
        _core.cpu.quant_matmul(
            flat.data_ptr(),
            self.blocks.data_ptr(),
            out.data_ptr(),
            flat.shape[0],
            self.out_features,
            self.in_features,
            self.qtype,
            threads,
            isa,
        )
        return out.reshape(*x.shape[:-1], self.out_features)


def _dequantize(blocks: np.ndarray, qtype: str) -> np.ndarray:
    # gguf is imported where blocks are read, so a model without GGUF weights (a Hugging Face
    # folder) loads where the gguf package is not installed.
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(blocks, GGMLQuantizationType[qtype])
