"""gpt-oss (met.model.families.gpt_oss): attention sinks, biases on q/k/v/o, sliding (every other
layer) and full attention, YaRN, a top-k-softmax-routed MoE with biased experts and the clamped
SwiGLU. transformers' GptOssForCausalLM (float32, eager) on a tiny seeded model is the reference
for HF folders (float experts, and MXFP4 blocks as OpenAI ships them) and GGUF files of the same
weights (F32, and MXFP4 experts), the prompts past the 4-token window and the 8-token original
context; greedy tokens batch-invariant; `met serve` chats."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf_writing import SPECIALS, add_bpe_tokenizer, bpe_vocab
from gpt_oss_fixtures import EXPERT_WEIGHTS, WINDOW, gpt_oss_gguf, gpt_oss_model
from hf_reference import (
    STEPS,
    Q,
    assert_greedy_batch_invariant,
    assert_matches_transformers,
    assert_serves_chat,
    hf_logits,
    save_hf,
)
from model_fixtures import PagedRunner, stepped_logits
from safetensors.torch import load_file, save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from met.gguf_loader import open_gguf, read_config
from met.hf_loader import read_hf_config
from met.model.capability import (
    CLAMPED_SWIGLU,
    MOE,
    ROPE_MAGNITUDE,
    SINKS,
    SLIDING,
    TOPK_ROUTER,
    cannot_run,
    missing,
    refusal,
)
from met.model.cpu_llama import CpuLlama
from met.model.mxfp4 import ggml_mxfp4
from met.model.sinks import with_sink_column
from met.models import load_model
from met.parallel.shard import ShardError, check_divisible

# Float32 everywhere (MXFP4 experts: the reference holds the same rounded weights): met and
# transformers differ in summation order only. A GGUF file's MXFP4 experts are read as stored, so
# their matmuls take int8 activations: measured 0.8% of the largest logit.
TOL = 1e-5
TOL_BLOCKS = 2e-2
# The C++ forward against the torch one over the same blocks: the C++ attention multiplies P.V
# in bf16 (test_moe's bound for the same reason).
TOL_CPP = 2e-2


def _hf_mxfp4_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An HF expert tensor [E, in, out] as OpenAI's checkpoints store it: blocks uint8
    [E, out, in / 32, 16] (weight 2i in byte i's low nibble, 2i + 1 in its high one) and E8M0
    scales [E, out, in / 32], from ggml's blocks (16 low nibbles, then 16 high; the same
    exponent byte)."""
    rows = weight.transpose(1, 2).contiguous().numpy()
    raw = gguf.quants.quantize(rows, Q.MXFP4)
    raw = raw.reshape(*rows.shape[:2], -1, 17)
    scales, qs = raw[..., 0], raw[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return torch.from_numpy(np.ascontiguousarray(blocks)), torch.from_numpy(scales.copy())


def _save_hf_mxfp4(model, folder):
    """The model as an HF folder whose experts are MXFP4 blocks and scales."""
    save_hf(model, folder)
    shard = folder / "model.safetensors"
    state = load_file(shard)
    for name in [n for n in state if n.endswith(EXPERT_WEIGHTS)]:
        state[name + "_blocks"], state[name + "_scales"] = _hf_mxfp4_blocks(state.pop(name))
    save_file(state, shard, metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("kind", ["hf", "hf_mxfp4", "f32", "mxfp4"])
def test_gpt_oss_matches_transformers(tmp_path, kind):
    rounded = Q.MXFP4 if kind.endswith("mxfp4") else None
    model = gpt_oss_model(truncate=not kind.startswith("hf"), rounded=rounded)
    if kind == "hf":
        path = save_hf(model, tmp_path / "gpt_oss")
    elif kind == "hf_mxfp4":
        path = _save_hf_mxfp4(model, tmp_path / "gpt_oss")
    else:
        path = gpt_oss_gguf(model, tmp_path / "g.gguf", Q.MXFP4 if kind == "mxfp4" else Q.F32)
    # The attention weights are float, not blocks: the torch forward runs these files (MXFP4
    # experts through the quantized matmul, HF ones dequantized at load).
    tol = TOL_BLOCKS if kind == "mxfp4" else TOL
    assert assert_matches_transformers(path, hf_logits(model), tol) == ["torch"]


def _assert_cpp_matches_torch(blocks) -> None:
    """The C++ forward against the torch forward over the same blocks and matmul kernels."""
    torch_runner = PagedRunner(blocks, num_blocks=32, block_size=4, seed=1)
    cpp = PagedRunner(blocks, num_blocks=32, block_size=4, seed=1)
    cpp.model = CpuLlama(blocks, cpp.cache)
    for rows in STEPS:
        for got, ref in zip(cpp.step(rows), torch_runner.step(rows), strict=True):
            torch.testing.assert_close(got, ref, atol=TOL_CPP * ref.abs().max().item(), rtol=0)


def test_the_cpp_forward_runs_gpt_oss_like_the_torch_one(tmp_path):
    # Every linear weight but the router in Q8_0 blocks, the reference holding the same values.
    # The routers scaled by 4: wider top-2 margins than the int8 activations' noise, which
    # otherwise flips a near-tied expert on one forward (measured: 11% of the largest logit on
    # one token, where both int8 forwards also part from transformers' float one).
    model = gpt_oss_model(truncate=True, rounded=Q.Q8_0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.router.weight *= 4.0
    path = gpt_oss_gguf(model, tmp_path / "q.gguf", Q.Q8_0, Q.Q8_0)
    want = hf_logits(model)
    _, dense, _ = load_model(path, device="cpu", weight_format="dequantized")
    runner = PagedRunner(dense, num_blocks=32, block_size=4, seed=1)
    for seq, logits in stepped_logits(runner, STEPS, want).items():
        atol = TOL * want[seq].abs().max().item()
        torch.testing.assert_close(logits, want[seq], atol=atol, rtol=0, msg=seq)
    # The blocks: the C++ forward (sinks, biases, top-k softmax routing, the clamped SwiGLU)
    # against the torch forward over the same blocks and matmul kernels.
    _, blocks, _ = load_model(path, device="cpu", weight_format="gguf")
    assert cannot_run(blocks, "cpu") is None
    _assert_cpp_matches_torch(blocks)


def test_the_cpp_forward_reads_mxfp4_experts_as_the_torch_one(tmp_path):
    # As gpt-oss files come: MXFP4 experts, Q8_0 elsewhere; both forwards read the blocks as
    # stored (memory: the file's), through the same matmul kernels.
    model = gpt_oss_model(truncate=True)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.router.weight *= 4.0  # as above: no near-tied experts
    path = gpt_oss_gguf(model, tmp_path / "m.gguf", Q.MXFP4, Q.Q8_0)
    _, blocks, _ = load_model(path, device="cpu", weight_format="gguf")
    experts = blocks.layers[0]["moe"].experts
    assert {w.qtype for pair in experts.values() for w in pair} == {"MXFP4"}
    assert cannot_run(blocks, "cpu") is None
    _assert_cpp_matches_torch(blocks)


def test_gpt_oss_plan_and_capability(tmp_path):
    path = gpt_oss_gguf(gpt_oss_model(truncate=True), tmp_path / "g.gguf")
    config = read_config(open_gguf(path), path)
    specs = config.layer_specs()
    assert config.family == "gpt_oss" and [s.window for s in specs] == [WINDOW, None] * 2
    assert {(s.mlp, s.router, s.sinks, s.rope) for s in specs} == {
        ("moe", "topk_softmax", True, "global")
    }
    assert missing(config, "torch") == [] and missing(config, "cpu") == []
    assert missing(config, "cuda") == [
        SLIDING,
        MOE,
        ROPE_MAGNITUDE,
        SINKS,
        TOPK_ROUTER,
        CLAMPED_SWIGLU,
    ]
    assert refusal(config, "cuda") == (
        "gpt_oss: the CUDA forward does not implement sliding-window attention, "
        "mixture-of-experts MLPs, scaled RoPE magnitude, attention sinks, top-k softmax "
        "routing, clamped SwiGLU experts; the torch forward runs it (--weight-format dequantized)"
    )
    folder = read_hf_config(save_hf(gpt_oss_model(), tmp_path / "gpt_oss"))
    assert folder.rope_scaling.truncate is False and config.rope_scaling.truncate is True
    assert folder.rope_attn_factor == pytest.approx(config.rope_attn_factor)


def test_hf_mxfp4_blocks_repack_into_the_values_transformers_reads():
    # Every code in every position, scales across the exponent range (with E8M0's low end); the
    # repacked rows as ggml (gguf's reader, the kernels' reference) reads them, against
    # transformers' own dequantization of the checkpoint's blocks ([E, in, out]: transposed).
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 5, 4, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(0, 200, (3, 5, 4), dtype=torch.uint8, generator=gen)
    scales[0, 0] = torch.tensor([0, 1, 2, 199], dtype=torch.uint8)
    packed = ggml_mxfp4(blocks, scales)
    assert packed.shape == (3, 5, 4 * 17)
    got = gguf.quants.dequantize(packed.numpy(), Q.MXFP4)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)
    assert torch.equal(torch.from_numpy(got), want)


def test_sink_column_is_the_sink_in_the_softmax_denominator():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen) for n in (5, 7, 7))
    mask = torch.zeros(5, 7).masked_fill_(torch.ones(5, 7).triu(3).bool(), float("-inf"))
    sinks = torch.randn(3, 1, generator=gen).expand(3, 5)
    keys, values, full = with_sink_column(k, v, mask, sinks)
    got = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=full)
    # transformers' eager gpt-oss attention: the sink as an extra logit, dropped after softmax.
    scores = q @ k.transpose(-1, -2) / 8**0.5 + mask
    logits = torch.cat([scores, sinks[None, :, :, None].expand(2, 3, 5, 1)], dim=-1)
    want = torch.softmax(logits, dim=-1)[..., :-1] @ v
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert not torch.allclose(got, plain, atol=1e-3)


def test_gpt_oss_greedy_is_batch_invariant(tmp_path):
    # Q8_0 blocks: the C++ forward (gguf) and the torch one; MXFP4 experts, float at load: the
    # torch forward whatever the format asked.
    model = gpt_oss_model(truncate=True)
    assert_greedy_batch_invariant(gpt_oss_gguf(model, tmp_path / "q.gguf", Q.Q8_0, Q.Q8_0))
    assert_greedy_batch_invariant(gpt_oss_gguf(model, tmp_path / "m.gguf", Q.MXFP4))


@pytest.mark.slow
def test_met_serve_chats_with_gpt_oss(tmp_path):
    assert_serves_chat(
        gpt_oss_gguf(gpt_oss_model(truncate=True), tmp_path / "g.gguf", Q.MXFP4), "gpt-oss"
    )


def test_tensor_parallel_refuses_sinks_in_one_line(tmp_path):
    path = gpt_oss_gguf(gpt_oss_model(truncate=True), tmp_path / "g.gguf")
    config = read_config(open_gguf(path), path)
    with pytest.raises(ShardError, match="attention sinks and biased experts"):
        check_divisible(config, 2)
    check_divisible(config, 1)


def test_a_turn_ends_at_return_and_call_never_at_end(tmp_path):
    # As llama.cpp reads o200k_harmony files: <|end|> closes one message of a turn (analysis
    # before the answer), so it ends no generation even where the file names it as EOT.
    specials = [*SPECIALS, "<|end|>", "<|return|>", "<|call|>"]

    def tokenizer(w: gguf.GGUFWriter) -> None:
        add_bpe_tokenizer(w, "qwen2", bos=0, eos=specials.index("<|return|>"), specials=specials)
        w.add_eot_token_id(specials.index("<|end|>"))

    model = gpt_oss_model(truncate=True, vocab_size=len(bpe_vocab(specials)))
    path = gpt_oss_gguf(model, tmp_path / "g.gguf", tokenizer=tokenizer)
    config = read_config(open_gguf(path), path)
    assert sorted(config.eos_token_ids) == [
        specials.index("<|return|>"),
        specials.index("<|call|>"),
    ]
