"""GGUF block formats the C++ kernels do not read, converted at load time into one they do.

The quantized matmul reads the formats of met.kernels.cpu_quant.QTYPES as the file stores them.
The other quantized format met loads (Q2_K) is re-expressed as Q8_0 as it is read,
rather than dequantized to float (4 bytes a weight: a 7B model would need 28 GB): dequantized by
the gguf package, then quantized to int8 per 32-block (error <= 1/254 of the block's largest
weight, below Q2_K's own steps of 1/3 of a sub-block's range). 8.5 bits a weight, more than
the file's 2.6.
"""

from __future__ import annotations

import numpy as np

from met.kernels.cpu_quant import QTYPES


def kernel_format(qtype: str) -> str:
    """The kernel format a GGUF block format is read as."""
    return qtype if qtype in QTYPES else "Q8_0"


def to_kernel_blocks(raw: np.ndarray, qtype: str) -> tuple[np.ndarray, str]:
    """raw [rows, row bytes] of a `qtype` tensor -> (the rows in kernel_format(qtype), its name)."""
    target = kernel_format(qtype)
    if target == qtype:
        return raw, qtype
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    weights = dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32, copy=False)
    return np.ascontiguousarray(quantize(weights, GGMLQuantizationType.Q8_0)), target
