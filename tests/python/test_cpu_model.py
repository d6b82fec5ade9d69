"""The C++ CPU forward (met.model.cpu_llama.CpuLlama) against the torch forward over the same
GGUF blocks, its batch invariance, its elementwise kernels against torch, and where the engine
picks it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from model_fixtures import PagedRunner, random_weights, tiny_config
from reference_quants import quant_linear

from met import _core
from met.model.capability import cannot_run
from met.model.cpu_llama import CpuLlama, _dense_table, _dims, _layer, cpu_forward_for
from met.model.cpu_mlp import weight
from met.model.linear import RowParts
from met.model.llama import LlamaModel

LINEAR = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "lm_head")
# Against a reference that shares the C++ forward's reductions (below), the two measured equal bit
# for bit on every path (the rest is elementwise IEEE arithmetic in the same order); ATOL is the
# margin the comparison was written with.
ATOL = 1e-3
# Every test here runs once per kernel path this CPU supports (conftest.cpu_path).
pytestmark = pytest.mark.usefixtures("cpu_path")


class SharedReductionsLlama(LlamaModel):
    """The torch forward with its three order-sensitive stages (RMSNorm, SiLU, attention) run
    through the C++ kernels, each checked on its own against torch (test_elementwise_kernels_
    match_torch, test_cpu_attention.py): everything else (embedding, the fused QKV split and
    biases, RoPE, GQA, the K/V store and its fp16 rounding, slots, residuals, the head) stays
    the torch model's own.

    Why: both forwards round every matmul input to int8 per 32-block and K/V to fp16, so a 1e-7
    difference in the order of a float sum that lands on a rounding boundary flips one int8 step
    or fp16 ulp, which later layers amplify to 1e-2 (a Sapphire Rapids Xeon's torch kernels did
    that to the fp16-pool test; a float64 RMSNorm in the reference does it here). Sharing the
    reductions makes both sides take the same rounding decisions on every CPU and path, so the
    comparison stays at 1e-3.
    """

    def forward(self, cache, ids, pos, slots, tables, seq_lens, cu, logits_rows):
        # _attention needs the rows as the C++ kernel reads them; the torch plan keeps slots.
        self._rows = (tables.contiguous(), seq_lens.contiguous(), cu.contiguous(), cache.block_size)
        return super().forward(cache, ids, pos, slots, tables, seq_lens, cu, logits_rows)

    __call__ = forward

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, dim = x.shape
        _core.cpu.rms_norm(
            x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, dim, self.config.norm_eps
        )
        return out

    def _gated(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate, up = gate.contiguous(), up.contiguous()
        out = torch.empty_like(gate)
        _core.cpu.silu_mul(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel())
        return out

    def _attention(self, q, k, v, k_cache, v_cache, plan, sinks=None) -> torch.Tensor:
        c = self.config
        tables, seq_lens, cu, block_size = self._rows
        q = q.contiguous()
        out = torch.empty(q.shape[0], c.n_heads * c.head_dim)
        _core.cpu.paged_attention(
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            out.data_ptr(),
            len(seq_lens),
            cu.data_ptr(),
            seq_lens.data_ptr(),
            tables.data_ptr(),
            tables.shape[1],
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            block_size,
            1.0 / c.head_dim**0.5,
            kv_half=k_cache.dtype == torch.float16,
            sinks_ptr=0 if sinks is None else sinks.data_ptr(),
        )
        return out


def quant_model(
    qtype: str = "Q8_0", quant_embed: bool = True, reference: bool = False, **overrides
) -> LlamaModel:
    config = tiny_config(**overrides)
    weights = random_weights(config, seed=3)
    for name in list(weights):
        if name.split(".")[-1] in LINEAR or (quant_embed and name == "embed"):
            weights[name] = quant_linear(weights[name], qtype)
    return (SharedReductionsLlama if reference else LlamaModel)(config, weights)


def paired_runners(
    model: LlamaModel, kv_dtype: torch.dtype | None = None
) -> tuple[PagedRunner, PagedRunner]:
    """Two runners over separate pools with the same block ids: torch, then C++."""
    torch_runner = PagedRunner(model, num_blocks=64, block_size=4, kv_dtype=kv_dtype)
    cpp_runner = PagedRunner(model, num_blocks=64, block_size=4, kv_dtype=kv_dtype)
    cpp_runner.model = CpuLlama(model, cpp_runner.cache)
    return torch_runner, cpp_runner


SUPER_SHAPE = {"hidden": 256, "head_dim": 64, "ffn": 256}
STEPS = [
    [("a", list(range(3, 14)))],
    [("a", [20]), ("b", [5, 6, 7, 8, 9, 10, 11])],
    [("b", [30]), ("a", [21]), ("c", [1, 2])],
    [("a", [22]), ("b", [31]), ("c", [3, 4, 5, 6, 7, 8, 9, 10, 11])],
]


@pytest.mark.parametrize(
    ("qtype", "overrides", "quant_embed"),
    [
        ("Q8_0", {}, True),
        ("Q4_1", {}, False),
        ("Q4_0", {"n_kv_heads": 4}, True),
        ("Q8_0", {"architecture": "qwen2", "attention_bias": True, "tie_embeddings": True}, True),
        ("Q5_1", {}, True),
        ("IQ4_NL", {}, False),
        # The super-block formats need K a multiple of 256.
        *((qtype, SUPER_SHAPE, True) for qtype in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")),
        ("IQ4_XS", SUPER_SHAPE, False),
    ],
)
def test_matches_the_torch_forward(qtype: str, overrides: dict, quant_embed: bool) -> None:
    model = quant_model(qtype, quant_embed, reference=True, **overrides)
    torch_runner, cpp_runner = paired_runners(model)
    for rows in STEPS:
        want = torch_runner.step(rows)
        got = cpp_runner.step(rows)
        for w, g in zip(want, got, strict=True):
            assert torch.isfinite(g).all()
            torch.testing.assert_close(g, w, atol=ATOL, rtol=0)


def test_fused_projections_in_several_formats_run_as_stored() -> None:
    """A K-quant file keeps q/k and v (gate and up) in different formats: the fused weight is
    its parts as stored (RowParts), and the C++ forward matmuls each into its columns."""
    config = tiny_config()
    weights = random_weights(config, seed=3)
    for name in list(weights):
        kind = name.split(".")[-1]
        if kind in LINEAR or name == "embed":
            qtype = "Q4_0" if kind in ("wv", "w_up") else "Q8_0"
            weights[name] = quant_linear(weights[name], qtype)
    model = SharedReductionsLlama(config, weights)
    assert all(isinstance(model.layers[0][n], RowParts) for n in ("wqkv", "w_gate_up"))
    assert cannot_run(model, "cpu") is None
    torch_runner, cpp_runner = paired_runners(model)
    for rows in STEPS:
        for w, g in zip(torch_runner.step(rows), cpp_runner.step(rows), strict=True):
            torch.testing.assert_close(g, w, atol=ATOL, rtol=0)


def test_an_fp16_pool_matches_the_torch_forward_over_an_fp16_pool() -> None:
    # Both round K/V to float16 as they store them (ties to even) and read them back exactly.
    model = quant_model("Q8_0", reference=True)
    torch_runner, cpp_runner = paired_runners(model, torch.float16)
    assert cpp_runner.cache.k.dtype == torch.float16
    for rows in STEPS:
        for w, g in zip(torch_runner.step(rows), cpp_runner.step(rows), strict=True):
            torch.testing.assert_close(g, w, atol=ATOL, rtol=0)
    # The same fp32 K/V rounded the same way (ties to even): the pools hold the same bits.
    assert torch.equal(cpp_runner.cache.k, torch_runner.cache.k)
    assert torch.equal(cpp_runner.cache.v, torch_runner.cache.v)


def _decode_rows_alone_and_batched() -> None:
    """A decode row's logits alone and among other rows, after differently chunked prompts."""
    model = quant_model()
    alone = PagedRunner(model, num_blocks=64, block_size=4)
    alone.model = CpuLlama(model, alone.cache)
    batched = PagedRunner(model, num_blocks=64, block_size=4, seed=7)
    batched.model = CpuLlama(model, batched.cache)
    prompt = list(range(3, 14))
    alone.step([("a", prompt)])
    # The batched run chunks the prompt differently and shares every step with other rows.
    batched.step([("a", prompt[:5]), ("b", [9, 9, 9])])
    batched.step([("b", [1]), ("a", prompt[5:])])
    for token in (40, 41, 42):
        (solo,) = alone.step([("a", [token])])
        _, mixed, _ = batched.step([("b", [token]), ("a", [token]), ("c", [7, 8, 9, 10, 11])])
        assert torch.equal(solo, mixed)


def test_a_decode_row_is_bitwise_the_same_alone_and_batched() -> None:
    _decode_rows_alone_and_batched()


def test_a_row_is_bitwise_the_same_on_tiles_and_on_the_vnni_kernel(cpu_path: str) -> None:
    # The amx path takes tiles from amx_min_rows rows and VNNI registers below: at 2, the lone
    # decode row runs every matmul on VNNI and the batched steps run theirs on tiles.
    if not cpu_path.startswith("amx"):
        pytest.skip("only the amx path switches kernels with the number of rows")
    _core.cpu.set_amx_min_rows(2)
    try:
        _decode_rows_alone_and_batched()
    finally:
        _core.cpu.set_amx_min_rows(1)


@pytest.mark.parametrize(("qtype", "overrides"), [("Q4_1", {}), ("Q4_K", SUPER_SHAPE)])
def test_logits_are_the_scalar_paths_bits(cpu_path: str, qtype: str, overrides: dict) -> None:
    """The avx512 and amx paths (tiles included) make the scalar path's exact int32 per block and
    run its epilogue, and the other kernels agree across paths too: a step's logits are the same
    bits on each, so a forward is reproducible across those machines, not only batch-invariant."""
    if cpu_path in ("scalar", "avx2"):
        pytest.skip("the scalar path is the reference; avx2 sums its dots in another order")
    model = quant_model(qtype, **overrides)

    def logits() -> list[torch.Tensor]:
        runner = PagedRunner(model, num_blocks=64, block_size=4)
        runner.model = CpuLlama(model, runner.cache)
        return [row for rows in STEPS for row in runner.step(rows)]

    on_path = logits()
    _core.cpu.set_cpu_path("scalar")
    for got, want in zip(on_path, logits(), strict=True):
        assert torch.equal(got, want)


def test_bad_rows_raise_value_error_and_the_model_keeps_working() -> None:
    model = quant_model()
    runner = PagedRunner(model, num_blocks=8, block_size=4)
    cpu = CpuLlama(model, runner.cache)
    ok = dict(
        input_ids=torch.tensor([1, 2]),
        positions=torch.tensor([0, 1]),
        slot_mapping=torch.tensor([0, 1]),
        block_tables=torch.tensor([[0]], dtype=torch.int32),
        seq_lens=torch.tensor([2], dtype=torch.int32),
        cu_seqlens=torch.tensor([0, 2], dtype=torch.int32),
        logits_rows=torch.tensor([1]),
    )
    bad = [
        {"block_tables": torch.tensor([[8]], dtype=torch.int32)},
        {"input_ids": torch.tensor([1, 500])},
        {"seq_lens": torch.tensor([300], dtype=torch.int32)},
        {"logits_rows": torch.tensor([2])},
        {"cu_seqlens": torch.tensor([0, 1], dtype=torch.int32)},
    ]
    for change in bad:
        with pytest.raises(ValueError):
            cpu.forward(runner.cache, **(ok | change))
    assert torch.isfinite(cpu.forward(runner.cache, **ok)).all()


def test_layers_cross_as_typed_structs_of_their_kind() -> None:
    # What CpuLlama hands the C++ forward: bound structs, a layer's kind as enums, so a layer of
    # a kind whose parts are missing is refused by the forward itself, by name.
    model = quant_model()
    runner = PagedRunner(model, num_blocks=8, block_size=4)
    impl = CpuLlama(model, runner.cache)._impl
    assert impl.path in ("scalar", "avx2", "avx512", "amx")
    pairs = zip(model.layers, model.specs, strict=True)
    layers = [_layer(layer, spec, None) for layer, spec in pairs]
    kinds = {(lw.mixer, lw.mlp) for lw in layers}
    assert kinds == {(_core.cpu.Mixer.attention, _core.cpu.Mlp.dense)}
    assert layers[0].wqkv.k == model.config.hidden and layers[0].w_down.n == model.config.hidden
    layers[1].mixer = _core.cpu.Mixer.recurrent
    weights = _core.cpu.LlamaWeights()
    weights.embed, weights.lm_head = weight(model.embed), weight(model.lm_head)
    weights.norm = model.norm.data_ptr()
    cos, sin = _dense_table(model.cos), _dense_table(model.sin)
    weights.rope_cos, weights.rope_sin = cos.data_ptr(), sin.data_ptr()
    weights.layers = layers
    dims = _dims(model, runner.cache, cos.shape[0])
    pool = runner.cache.k.data_ptr(), runner.cache.v.data_ptr()
    with pytest.raises(ValueError, match="recurrent layers need positive heads"):
        _core.cpu.LlamaForward(dims, weights, *pool)


def test_the_engine_picks_the_cpp_forward_only_for_cpu_gguf_weights() -> None:
    quantized = quant_model()
    cache = quantized.allocate_kv_cache(4, 4)
    assert isinstance(cpu_forward_for(quantized, cache), CpuLlama)
    config = tiny_config()
    dense = LlamaModel(config, random_weights(config))
    assert cpu_forward_for(dense, dense.allocate_kv_cache(4, 4)) is dense
    assert "not GGUF blocks" in cannot_run(dense, "cpu")


def test_elementwise_kernels_match_torch() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 576, generator=gen) * 30
    weight = torch.rand(576, generator=gen) + 0.5
    out = torch.empty_like(x)
    _core.cpu.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), 5, 576, 1e-5)
    torch.testing.assert_close(out, F.rms_norm(x, (576,), weight, 1e-5), rtol=1e-5, atol=1e-5)

    v = torch.randn(6, 64, generator=gen)
    angles = torch.rand(6, 32, generator=gen) * 6
    cos, sin = angles.cos().contiguous(), angles.sin().contiguous()
    want = torch.cat((v[:, :32] * cos - v[:, 32:] * sin, v[:, 32:] * cos + v[:, :32] * sin), -1)
    _core.cpu.rope(v.data_ptr(), cos.data_ptr(), sin.data_ptr(), 6, 64)
    torch.testing.assert_close(v, want, rtol=1e-6, atol=1e-6)

    gate, up = torch.randn(1536, generator=gen) * 10, torch.randn(1536, generator=gen)
    out = torch.empty(1536)
    _core.cpu.silu_mul(gate.data_ptr(), up.data_ptr(), out.data_ptr(), 1536)
    torch.testing.assert_close(out, F.silu(gate) * up, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spread", [0, 1, 2])
def test_forward_rows_packs_like_forward(spread: int) -> None:
    """Rows packed in C++ give forward's bits: the first `spread` rows (a verify step's) a logits
    row per token, the others one for their last token; and each logits row its argmax."""
    model = quant_model()
    packed = PagedRunner(model, num_blocks=64, block_size=4)
    packed.model = CpuLlama(model, packed.cache)
    by_rows = PagedRunner(model, num_blocks=64, block_size=4)
    cpu = CpuLlama(model, by_rows.cache)
    for rows in STEPS:
        logits, verify = packed.step(rows), min(spread, len(rows))
        want = [row for every in logits[:verify] for row in every]
        want += [every[-1] for every in logits[verify:]]
        starts = by_rows.reserve(rows)
        tables = [by_rows.tables[name] for name, _ in rows]
        got, greedy = cpu.forward_rows([tokens for _, tokens in rows], starts, tables, verify)
        assert torch.equal(got, torch.stack(want))
        assert greedy == got.argmax(dim=-1).tolist()
    with pytest.raises(ValueError):
        cpu.forward_rows([[1], []], [0, 0], [[0], [1]])
    with pytest.raises(ValueError, match="spread"):
        cpu.forward_rows([[1]], [0], [[0]], spread=2)
