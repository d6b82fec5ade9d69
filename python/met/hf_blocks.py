"""A Hugging Face folder's weights in the format the load asked for: QuantLinear blocks for the
C++ forward (--device cpu --weight-format gguf), or float in the model's dtype for the torch one.

A folder holds float weights and, for gpt-oss, MXFP4 experts, which the family module repacks
into QuantLinear blocks (ggml's layout) as they are read. Keeping blocks, those stay as they are
(memory: the folder's bytes, no float copy) and every float linear weight whose width is whole
32-blocks is quantized to Q8_0 (within 1/254 of each block's largest weight; 8.5 bits a
weight), so that the C++ forward runs the whole model. Otherwise the blocks are dequantized for
the torch forward. The load log says which was done.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import Tensor

from met.gguf_loader import LINEAR_SUFFIXES
from met.kernels.cpu_quant import QuantLinear
from met.model.linear import Weight

log = logging.getLogger("met.engine")
_Q8_UNIT = 32  # Q8_0's block: a weight's input width must be whole blocks
_Q8_ROWS = 4096  # rows quantized at a time, bounding the quantizer's float temporaries


def weight_format(
    weights: dict[str, Weight], dtype: torch.dtype, keep_blocks: bool, folder: Path
) -> None:
    """Convert `weights` in place: blocks kept and float linear weights quantized to Q8_0
    (keep_blocks), else blocks dequantized to `dtype`."""
    stored = [name for name, w in weights.items() if isinstance(w, QuantLinear)]
    kinds = "/".join(sorted({weights[name].qtype for name in stored}))
    if not keep_blocks:
        for name in stored:
            weights[name] = weights[name].dequantize().to(dtype)
        if stored:
            log.info(
                "%s: %d %s weights dequantized to %s for the torch forward (--device cpu "
                "--weight-format gguf keeps them as blocks)",
                folder,
                len(stored),
                kinds,
                str(dtype).removeprefix("torch."),
            )
        return
    quantized = [name for name, w in weights.items() if _quantizable(name, w)]
    for name in quantized:
        weights[name] = _q8_0(weights[name])
    kept = sum(weights[name].nbytes for name in stored)
    log.info(
        "%s: %d %s weights kept as stored blocks (%d bytes), %d float linear weights quantized "
        "to Q8_0, for the C++ forward",
        folder,
        len(stored),
        kinds or "block",
        kept,
        len(quantized),
    )


def _quantizable(name: str, weight: Weight) -> bool:
    linear = isinstance(weight, Tensor) and weight.dim() == 2 and name.endswith(LINEAR_SUFFIXES)
    return linear and weight.shape[1] % _Q8_UNIT == 0


def _q8_0(weight: Tensor) -> QuantLinear:
    rows = range(0, weight.shape[0], _Q8_ROWS)
    return QuantLinear.concat(
        [QuantLinear.from_float(weight[r : r + _Q8_ROWS], "Q8_0") for r in rows]
    )
