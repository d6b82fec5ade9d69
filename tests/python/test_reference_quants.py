"""The tests' reference quantizers (reference_quants) against gguf's dequantize: blocks of the
right size whose reading is close to the float weights, so the layouts agree with ggml's."""

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize
from reference_quants import QUANTIZERS, quantize

# Relative L2 error of the plain scale choice on normal weights (measured 0.33, 0.18, 0.078,
# 0.038, 0.019, 0.080, 0.080): each format's steps, with a margin. A wrong layout reads as noise
# (error near 1 or more).
TOLERANCE = {
    "Q2_K": 0.4,
    "Q3_K": 0.25,
    "Q4_K": 0.1,
    "Q5_K": 0.05,
    "Q6_K": 0.03,
    "IQ4_NL": 0.1,
    "IQ4_XS": 0.1,
}


@pytest.mark.parametrize("qtype", QUANTIZERS, ids=lambda q: q.name)
def test_quantized_blocks_read_back_close_to_the_weights(qtype: gguf.GGMLQuantizationType) -> None:
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((16, 512)).astype(np.float32)
    weights[3] *= 1e-3  # rows of other magnitudes, and an all-zero one
    weights[5] = 0.0
    blocks = quantize(weights, qtype)
    elements, size = gguf.GGML_QUANT_SIZES[qtype]
    assert blocks.shape == (16, 512 // elements * size) and blocks.dtype == np.uint8
    back = dequantize(blocks, qtype)
    assert np.all(back[5] == 0.0)
    for rows in (slice(None), slice(3, 4)):
        error = np.linalg.norm(back[rows] - weights[rows]) / np.linalg.norm(weights[rows])
        assert error < TOLERANCE[qtype.name], (rows, error)
