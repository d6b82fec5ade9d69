"""Qwen3.5 / Qwen3.5-MoE / Qwen3-Next (families qwen35, qwen35moe, qwen3next): Gated DeltaNet
layers with gated attention. transformers' own model on a tiny seeded config is the reference
for the HF folder and for GGUF files of the same weights as llama.cpp's converter writes them;
the chunked delta rule against the token-by-token one; the capability table's refusals."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from gguf_writing import Q
from hf_reference import save_hf
from hybrid_fixtures import build, rounded_like_gguf, write_gguf
from model_fixtures import PagedRunner, stepped_logits
from safetensors.torch import load_file, save_file

from met.gguf_loader import open_gguf, read_config
from met.kernels import cpu_delta
from met.kernels.cpu_quant import QuantLinear
from met.model import capability
from met.model.deltanet import chunk_delta_rule, recurrent_step, token_delta_rule
from met.models import load_model

# Float32: met and transformers differ in summation order only (the chunked rule's solve
# included): measured 1e-6..8e-6 of the largest logit. A Q8_0 file against transformers with
# the same rounded weights (the torch forward runs them dequantized): as close (5e-6). Unrounded,
# these random models move 15-50% under Q8_0 weights, in transformers as in met.
TOL = {"hf": 2e-5, "f32": 2e-5, "q8_0": 2e-5}
LONG = [(7 * i + 3) % 97 + 3 for i in range(150)]  # longer than a 64-token delta-rule chunk
SHORT = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]
SEQS = {"a": LONG, "b": SHORT}
# a in two prefill chunks (70 + 75 tokens: the second starts mid-chunk of the rule and
# carries the conv and delta state), b beside it; then decode steps of both, one token each.
STEPS = [
    [("a", LONG[:70]), ("b", SHORT[:4])],
    [("b", SHORT[4:9]), ("a", LONG[70:145])],
    [("a", LONG[145:146]), ("b", SHORT[9:10])],
    [("b", SHORT[10:]), ("a", LONG[146:147])],
    [("a", LONG[147:148])],
    [("a", LONG[148:149])],
    [("a", LONG[149:])],
]


@torch.inference_mode()
def _reference(model) -> dict[str, torch.Tensor]:
    return {name: model(torch.tensor([ids])).logits[0].float() for name, ids in SEQS.items()}


def _file(tmp_path, model, arch: str, kind: str):
    if kind == "hf":
        return save_hf(model, tmp_path / arch)
    return write_gguf(model, tmp_path / f"{arch}.gguf", arch, getattr(Q, kind.upper()))


def _met_logits(path, weight_format: str = "dequantized") -> dict[str, torch.Tensor]:
    _, model, _ = load_model(path, device="cpu", weight_format=weight_format)
    return stepped_logits(PagedRunner(model, num_blocks=64, block_size=4, seed=1), STEPS, SEQS)


@pytest.mark.parametrize(
    ("arch", "kind"),
    [
        ("qwen35", "hf"),
        ("qwen35", "f32"),
        ("qwen35moe", "hf"),
        ("qwen35moe", "f32"),
        ("qwen3next", "hf"),
        ("qwen3next", "f32"),
        ("qwen3next", "q8_0"),
    ],
)
def test_hybrid_matches_transformers(tmp_path, arch, kind):
    model = build(arch)  # on the CPU the delta rule runs in met's C++ kernels
    got = _met_logits(_file(tmp_path, model, arch, kind))
    want = _reference(rounded_like_gguf(model, Q.Q8_0) if kind == "q8_0" else model)
    for seq in SEQS:
        atol = TOL[kind] * want[seq].abs().max().item()
        torch.testing.assert_close(got[seq], want[seq], atol=atol, rtol=0, msg=f"{arch} {seq}")
        ours, theirs = got[seq].argmax(-1), want[seq].argmax(-1)
        rows = torch.arange(len(ours))
        gap = want[seq][rows, theirs] - want[seq][rows, ours]
        assert bool((gap <= atol).all()), f"{arch} {kind} {seq}: argmax {ours} vs {theirs}"


def test_a_multimodal_checkpoint_reads_its_text_model(tmp_path):
    """Qwen3.5 as published: model_type qwen3_5_moe with the text model's settings in
    text_config and its weights under model.language_model. (the vision tower's not read)."""
    model = build("qwen35moe")
    folder = save_hf(model, tmp_path / "mm")
    tensors = load_file(folder / "model.safetensors")
    renamed = {
        name if name.startswith("lm_head.") else "model.language_model." + name[6:]: t
        for name, t in tensors.items()
    }
    renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(8, 8)
    save_file(renamed, folder / "model.safetensors")
    text = json.loads((folder / "config.json").read_text())
    outer = {"model_type": "qwen3_5_moe", "text_config": text, "tie_word_embeddings": False}
    (folder / "config.json").write_text(json.dumps(outer))
    got, want = _met_logits(folder), _reference(model)
    for seq in SEQS:
        atol = TOL["hf"] * want[seq].abs().max().item()
        torch.testing.assert_close(got[seq], want[seq], atol=atol, rtol=0)


def test_the_torch_rule_matches_transformers_too(tmp_path, monkeypatch):
    """The torch delta rule (other devices' path) in the whole model, on the CPU."""
    monkeypatch.setattr(cpu_delta, "runs", lambda state: False)
    test_hybrid_matches_transformers(tmp_path, "qwen35moe", "hf")


def _rule_inputs(heads: int = 3, n: int = 150, dk: int = 16, dv: int = 40):
    gen = torch.Generator().manual_seed(0)
    q, k = (F.normalize(torch.randn(heads, n, dk, generator=gen), dim=-1) for _ in "qk")
    v = torch.randn(heads, n, dv, generator=gen)
    g = -torch.rand(heads, n, generator=gen)
    beta = torch.rand(heads, n, generator=gen)
    return q, k, v, g, beta, torch.randn(heads, dk, dv, generator=gen)


def test_chunked_delta_rule_is_the_token_by_token_rule():
    q, k, v, g, beta, state = _rule_inputs()
    want, want_state = token_delta_rule(q, k, v, g, beta, state)
    for chunk in (1, 16, 64, 200):  # 200: the whole sequence in one chunk
        out, final = chunk_delta_rule(q, k, v, g, beta, state, chunk=chunk)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(final, want_state, atol=1e-5, rtol=1e-5)
    # Two calls carrying the state are one call.
    first, mid = chunk_delta_rule(q[:, :70], k[:, :70], v[:, :70], g[:, :70], beta[:, :70], state)
    rest, final = chunk_delta_rule(q[:, 70:], k[:, 70:], v[:, 70:], g[:, 70:], beta[:, 70:], mid)
    torch.testing.assert_close(torch.cat([first, rest], 1), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, want_state, atol=1e-5, rtol=1e-5)


def test_hybrid_plan_and_capability(tmp_path):
    # With a multi-token-prediction block after the decoder's, as llama.cpp's converter writes
    # one (not run: its tensors are skipped, the plan is the decoder's 4 layers).
    path = write_gguf(build("qwen35moe"), tmp_path / "m.gguf", "qwen35moe", mtp=True)
    config = read_config(open_gguf(path), path)
    assert config.n_layers == 4
    assert [s.mixer for s in config.layer_specs()] == ["recurrent"] * 3 + ["attention"]
    assert config.layer_specs()[3].attn_gate and config.layer_specs()[0].shared_expert
    assert config.rope_dims == 4 and config.recurrent.conv_dim == 2 * 32 + 64
    assert capability.missing(config, "torch") == []
    _, model, _ = load_model(path, device="cpu")
    assert len(model.layers) == 4
    features = [capability.RECURRENT, capability.ATTN_GATE, capability.PARTIAL_ROPE]
    features.append(capability.SHARED_EXPERT)
    assert set(features) <= set(capability.model_features(config))
    assert capability.missing(config, "cpu") == []  # test_qwen3_hybrid_cpu.py runs it


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
def test_quantized_blocks_are_the_dequantized_weights(tmp_path, arch):
    """A Q8_0 file keeps its blocks (for the C++ forward and the torch forward's quantized
    matmul), split by whole rows: each kept weight dequantizes to the weight the dequantized load
    holds, bit for bit."""
    path = write_gguf(build(arch), tmp_path / "m.gguf", arch, Q.Q8_0)
    _, blocks, _ = load_model(path, device="cpu", weight_format="auto")
    _, dense, _ = load_model(path, device="cpu", weight_format="dequantized")
    assert capability.cannot_run(blocks, "cpu") is None
    for kept, plain in zip(blocks.layers, dense.layers, strict=True):
        pairs = [(kept["moe"].router, plain["moe"].router)]
        pairs += [(a, b) for e in kept["moe"].experts for a, b in zip(
            kept["moe"].experts[e], plain["moe"].experts[e], strict=True)]  # fmt: skip
        pairs += list(zip(kept["moe"].shared[1], plain["moe"].shared[1], strict=True))
        if "deltanet" in kept:
            mixers = kept["deltanet"], plain["deltanet"]
            pairs += [(mixers[0].w_in, mixers[1].w_in), (mixers[0].w_out, mixers[1].w_out)]
        else:
            pairs += [(kept["wqkv"], plain["wqkv"]), (kept["wo"], plain["wo"])]
        quantized = [a for a, _ in pairs if isinstance(a, QuantLinear)]
        assert len(quantized) == len(pairs) - 1  # all but the router, loaded dequantized
        for a, b in pairs:
            assert torch.equal(a.dequantize() if isinstance(a, QuantLinear) else a, b)


def test_cpp_delta_rule_is_the_torch_rule(cpu_path):
    """The C++ step on this kernel path and the C++ chunk form against the torch functions (the
    step's paths give each other's bits: tests/cpp/test_delta_rule.cc)."""
    q, k, v, g, beta, state = _rule_inputs()
    tokens = [x.transpose(0, 1).contiguous() for x in (q, k, v, g, beta)]  # token-major
    want, want_state = token_delta_rule(q, k, v, g, beta, state)
    pool = torch.zeros(3, *state.shape)
    pool[2] = state
    slot = torch.tensor([2])
    stepped = [cpu_delta.step(*(x[t : t + 1] for x in tokens), pool, slot) for t in range(150)]
    torch.testing.assert_close(torch.cat(stepped).transpose(0, 1), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pool[2], want_state, atol=1e-5, rtol=1e-5)
    assert not pool[0].any() and not pool[1].any()  # other slots untouched
    one, one_state = recurrent_step(*(x[:1] for x in tokens), state[None])
    ours = cpu_delta.step(*(x[:1] for x in tokens), state[None].clone(), torch.tensor([0]))
    torch.testing.assert_close(ours, one, atol=1e-6, rtol=1e-6)
    carried = state.clone()
    out = torch.cat(
        [cpu_delta.chunk(*(x[a:b] for x in tokens), carried, 64) for a, b in ((0, 70), (70, 150))]
    )
    torch.testing.assert_close(out.transpose(0, 1), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(carried, want_state, atol=1e-5, rtol=1e-5)
