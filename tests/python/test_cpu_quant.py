"""QuantLinear (met._core.cpu.quant_matmul) against gguf's dequantize + a torch matmul."""

import gguf
import numpy as np
import pytest
import torch
from gguf_writing import random_blocks

from met import _core
from met.kernels.cpu_quant import QTYPES, QuantLinear
from met.model.linear import RowParts, fuse_rows
from met.models import load_model

# Activations are rounded to int8 per 32-element block (step max|x|/127), weights are exact:
# the relative Frobenius error over a whole output stays near 3e-3; 1e-2 leaves a margin.
TOLERANCE = 1e-2
# Every test here runs once per kernel path this CPU supports (conftest.cpu_path).
pytestmark = pytest.mark.usefixtures("cpu_path")
ISAS = [
    isa
    for isa in ("scalar", "avx2", "avx512vnni", "amx-emulated", "amx-int8")
    if _core.cpu.isa_supported(isa)
]


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


# The formats gguf cannot quantize to: their tests take random valid blocks.
NO_QUANTIZER = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")


def _layer(qtype: str, rows: int, cols: int, seed: int = 0) -> QuantLinear:
    """A [rows, cols] weight in `qtype`: gguf's quantizer of a random weight, or random valid
    blocks for the formats it cannot quantize to (cols rounded up to their block)."""
    if qtype in NO_QUANTIZER:
        unit = _core.cpu.block_elements(qtype)
        cols = -(-cols // unit) * unit
        raw = random_blocks(rows, cols, gguf.GGMLQuantizationType[qtype], seed)
        return QuantLinear(torch.from_numpy(raw), qtype, rows, cols)
    gen = torch.Generator().manual_seed(seed)
    return QuantLinear.from_float(torch.randn(rows, cols, generator=gen) * 0.05, qtype)


@pytest.mark.parametrize("qtype", QTYPES)
def test_the_kernels_read_blocks_as_gguf_does(qtype: str) -> None:
    # dequantize_rows is the C++ paths' own reading (their reference): gguf's, value for value.
    layer = _layer(qtype, 24, 512, seed=3)
    out = torch.empty(24, 512)
    _core.cpu.dequantize_rows(layer.blocks.data_ptr(), out.data_ptr(), 24, 512, qtype)
    assert torch.equal(out, layer.dequantize())
    elements, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    assert layer.nbytes == 24 * 512 // elements * size  # the file's bytes, nothing wider


def test_mxfp4_scales_at_the_ends_of_e8m0() -> None:
    # E8M0 0 and 1 are float subnormals after ggml's halving, 254 and 255 the largest scales.
    blocks = np.zeros((4, 17), np.uint8)
    blocks[:, 0] = [0, 1, 254, 255]
    blocks[:2, 1:] = np.arange(16, dtype=np.uint8) * 17  # both nibbles of byte i are i
    blocks[2:, 1:] = 0x11  # value 1 only: more would overflow float32
    layer = QuantLinear(torch.from_numpy(blocks), "MXFP4", 4, 32)
    out = torch.empty(4, 32)
    _core.cpu.dequantize_rows(layer.blocks.data_ptr(), out.data_ptr(), 4, 32, "MXFP4")
    want = layer.dequantize()
    assert want[0, 1] == 2.0**-128 and want[1, 1] == 2.0**-127 and want[3, 0] == 2.0**127
    assert want[2, 31] == 2.0**126
    assert torch.equal(out, want)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("m", [1, 15, 16, 17, 64, 512])
def test_matches_dequantized_matmul(qtype: str, m: int) -> None:
    # N = 45 and K = 160 (5 blocks; 256 for the super-block formats) are no multiple of a tile.
    gen = torch.Generator().manual_seed(m)
    layer = _layer(qtype, 45, 160, seed=m)
    x = torch.randn(m, layer.in_features, generator=gen)
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
    with pytest.raises(ValueError, match="multiple of 256"):
        QuantLinear(torch.zeros(144, dtype=torch.uint8), "Q4_K", 1, 288)
    with pytest.raises(ValueError, match="no quantizer for Q4_K"):
        QuantLinear.from_float(torch.randn(4, 256), "Q4_K")


@pytest.mark.parametrize("qtype", QTYPES)
def test_rows_are_independent_of_the_batch(qtype: str) -> None:
    # The model relies on this for batch-invariant output: each row's activations are quantized
    # on their own, so a row's result is bit for bit the same alone or among others.
    layer = _layer(qtype, 96, 256)
    x = torch.randn(8, 256)
    together = layer(x)
    assert all(torch.equal(together[i], layer(x[i : i + 1])[0]) for i in range(8))


@pytest.mark.parametrize("qtype", QTYPES)
def test_amx_tiles_and_vnni_registers_give_a_row_the_same_bits(qtype: str) -> None:
    # The amx path's two kernels make the same exact per-block dots and run one epilogue: 21
    # rows on tiles (emulated here unless the CPU has AMX-INT8) give each row the bits it gets
    # alone on VNNI registers, M not a multiple of 16, N odd, K 5 blocks.
    tiled = [isa for isa in ("amx-emulated", "amx-int8") if _core.cpu.isa_supported(isa)]
    if not tiled:
        pytest.skip("the amx kernels need AVX-512 VNNI (emulated tiles) or AMX-INT8")
    layer = _layer(qtype, 37, 160)
    x = torch.randn(21, layer.in_features)
    before = _core.cpu.amx_min_rows()
    _core.cpu.set_amx_min_rows(16)
    try:
        for isa in tiled:
            together = layer(x, isa=isa)
            alone = [layer(x[i : i + 1], isa=isa)[0] for i in range(21)]
            assert all(torch.equal(together[i], alone[i]) for i in range(21)), isa
            assert torch.equal(together, layer(x, isa=tiled[0])), isa
    finally:
        _core.cpu.set_amx_min_rows(before)


def test_concat_rows_and_fuse() -> None:
    parts = [QuantLinear.from_float(torch.randn(n, 64), "Q8_0") for n in (32, 16, 16)]
    fused = QuantLinear.concat(parts)
    dense = torch.cat([p.dequantize() for p in parts])
    assert torch.equal(fused.dequantize(), dense)
    ids = torch.tensor([0, 47, 5, 63])
    assert torch.equal(fused.rows(ids), dense[ids])
    assert isinstance(fuse_rows(parts, torch.float32, torch.device("cpu")), QuantLinear)
    # Mixed formats cannot share one block matrix: the parts stay as stored, one weight to the
    # forward; with a dense part the fused weight is dense.
    mixed = [parts[0], QuantLinear.from_float(torch.randn(16, 64), "Q4_0")]
    kept = fuse_rows(mixed, torch.float32, torch.device("cpu"))
    assert isinstance(kept, RowParts) and (kept.out_features, kept.in_features) == (48, 64)
    x = torch.randn(3, 64)
    assert torch.equal(kept(x), torch.cat([p(x) for p in mixed], dim=-1))
    assert torch.equal(kept.dequantize(), torch.cat([p.dequantize() for p in mixed]))
    fallback = fuse_rows([parts[0], torch.randn(16, 64)], torch.float32, torch.device("cpu"))
    assert isinstance(fallback, torch.Tensor) and fallback.shape == (48, 64)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"weight_format": "q4"}, "weight_format"),
        ({"weight_format": "gguf", "dtype": "bfloat16"}, "float32"),
    ],
)
def test_load_model_rejects_unsupported_weight_formats(options: dict, message: str) -> None:
    # Checked before the file is opened.
    with pytest.raises(ValueError, match=message):
        load_model("unused.gguf", device="cpu", **options)
