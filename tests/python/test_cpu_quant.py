"""QuantLinear (met._core.cpu.quant_matmul) against gguf's dequantize + a torch matmul."""

import pytest
import torch

from met import _core
from met.kernels.cpu_quant import QTYPES, QuantLinear

# Activations are rounded to int8 per 32-element block (step max|x|/127), weights are exact:
# the relative Frobenius error over a whole output stays near 3e-3; 1e-2 leaves a margin.
TOLERANCE = 1e-2
ISAS = [isa for isa in ("scalar", "avx2", "avx512vnni") if _core.cpu.isa_supported(isa)]


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_matches_dequantized_matmul(qtype: str, m: int) -> None:
    gen = torch.Generator().manual_seed(m)
    weight = torch.randn(45, 160, generator=gen) * 0.05
    layer = QuantLinear.from_float(weight, qtype)
    x = torch.randn(m, 160, generator=gen)
    want = x.double() @ layer.dequantize().double().T
    for isa in ISAS:
        got = layer(x, isa=isa)
        assert got.shape == (m, 45)
        assert _relative_error(got.double(), want) < TOLERANCE, isa


def test_leading_dims_threads_and_checks() -> None:
    layer = QuantLinear.from_float(torch.randn(64, 96), "Q8_0")
    x = torch.randn(2, 3, 96)
    one = layer(x, n_threads=1)
    assert one.shape == (2, 3, 64)
    assert torch.equal(one, layer(x, n_threads=2))
    with pytest.raises(ValueError, match="float32"):
        layer(x.double())
    with pytest.raises(ValueError, match="features"):
        layer(torch.randn(1, 64))
    with pytest.raises(ValueError, match="bytes"):
        QuantLinear(torch.zeros(10, dtype=torch.uint8), "Q4_0", 64, 96)
