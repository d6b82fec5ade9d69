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
from gpt_oss_fixtures import EXPERT_WEIGHTS, WINDOW, gpt_oss_gguf, gpt_oss_model
from hf_reference import (
    Q,
    assert_greedy_batch_invariant,
    assert_matches_transformers,
    assert_serves_chat,
    hf_logits,
    save_hf,
)
from safetensors.torch import load_file, save_file

import met
from met.gguf_loader import open_gguf, read_config
from met.hf_loader import read_hf_config
from met.model.capability import CLAMPED_SWIGLU, SINKS, TOPK_ROUTER, missing, refusal
from met.model.config import ModelLoadError
from met.model.mxfp4 import dequantize_hf_mxfp4
from met.model.sinks import with_sink_column
from met.parallel.shard import ShardError, check_divisible

# Float32 everywhere (MXFP4 experts: the reference holds the same rounded weights): met and
# transformers differ in summation order only.
TOL = 1e-5


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
    model = gpt_oss_model(truncate=not kind.startswith("hf"), mxfp4=kind.endswith("mxfp4"))
    if kind == "hf":
        path = save_hf(model, tmp_path / "gpt_oss")
    elif kind == "hf_mxfp4":
        path = _save_hf_mxfp4(model, tmp_path / "gpt_oss")
    else:
        path = gpt_oss_gguf(model, tmp_path / "g.gguf", Q.MXFP4 if kind == "mxfp4" else Q.F32)
    # The C++ forward refuses gpt-oss (sinks, routing, activation): the torch forward runs it.
    assert assert_matches_transformers(path, hf_logits(model), TOL) == ["torch"]


def test_gpt_oss_plan_and_capability(tmp_path):
    path = gpt_oss_gguf(gpt_oss_model(truncate=True), tmp_path / "g.gguf")
    config = read_config(open_gguf(path), path)
    specs = config.layer_specs()
    assert config.family == "gpt_oss" and [s.window for s in specs] == [WINDOW, None] * 2
    assert {(s.mlp, s.router, s.sinks, s.rope) for s in specs} == {
        ("moe", "topk_softmax", True, "global")
    }
    assert missing(config, "torch") == []
    assert missing(config, "cpu") == [SINKS, TOPK_ROUTER, CLAMPED_SWIGLU]
    assert refusal(config, "cpu") == (
        "gpt_oss: the C++ CPU forward does not implement attention sinks, top-k softmax "
        "routing, clamped SwiGLU experts; the torch forward runs it (--weight-format dequantized)"
    )
    folder = read_hf_config(save_hf(gpt_oss_model(), tmp_path / "gpt_oss"))
    assert folder.rope_scaling.truncate is False and config.rope_scaling.truncate is True
    assert folder.rope_attn_factor == pytest.approx(config.rope_attn_factor)


def test_hf_mxfp4_blocks_dequantize_as_ggml_reads_them():
    # Every code in every position, scales across the exponent range (with E8M0's low end).
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 5, 4, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(0, 200, (3, 5, 4), dtype=torch.uint8, generator=gen)
    scales[0, 0] = torch.tensor([0, 1, 2, 199], dtype=torch.uint8)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).reshape(3, 5, 4, 32)
    ggml_qs = codes[..., :16] | (codes[..., 16:] << 4)
    ggml = torch.cat([scales[..., None], ggml_qs], dim=-1).numpy()
    want = gguf.quants.dequantize(ggml.reshape(3, 5, -1), Q.MXFP4)
    got = dequantize_hf_mxfp4(blocks, scales)
    assert got.shape == (3, 5, 128)
    assert torch.equal(got, torch.from_numpy(want))


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
    # auto: the torch forward on float weights (MXFP4 dequantized at load, until the C++
    # forward runs gpt-oss); gguf blocks are refused in one line.
    path = gpt_oss_gguf(gpt_oss_model(truncate=True), tmp_path / "g.gguf", Q.MXFP4)
    assert_greedy_batch_invariant(path, ("auto", "dequantized"))
    with pytest.raises(
        ModelLoadError, match=r"C\+\+ CPU forward does not implement attention sinks"
    ):
        met.LLM(model=str(path), device="cpu", weight_format="gguf")


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
