"""Gemma 4 (met.model.families.gemma4), dense and MoE: transformers' Gemma4ForCausalLM on tiny
seeded models (gemma4_fixtures: sliding and global layers of their own head widths, proportional
RoPE, two shared-KV layers; per-layer embeddings in the dense one, K as V and fewer global KV heads
and the MoE beside the dense MLP in the other) is the reference for the HF folder and for GGUF
files of the same weights (F32; Q8_0 against its own dequantized weights), over chunked and
batched paged steps past the sliding window; the shared-KV layers own no pages in the pool; prefix
hits, preemption and batching leave greedy tokens as they were; `met serve` chats."""

from __future__ import annotations

import json
import math

import pytest
import torch
from gemma4_chat import TEMPLATE
from gemma4_fixtures import LIKE_31B, WINDOW, dequantized, gemma4, write_gemma4_gguf
from hf_reference import SEQS, Q, assert_matches_transformers, assert_serves_chat, save_hf
from model_fixtures import exhaust_kv_once
from safetensors.torch import load_file, save_file

import met
from met.engine.capacity import weight_bytes
from met.engine.kv_budget import pool_shape
from met.gguf_loader import load_gguf
from met.hf_loader import read_hf_config
from met.model.capability import (
    DENSE_AND_MOE,
    K_AS_V,
    LAYER_HEADS,
    PER_LAYER_INPUTS,
    SCALED_ROUTER,
    SHARED_KV,
    V_NORM,
    missing,
    model_features,
    refusal,
)
from met.model.kv_cache import PagedKvCache
from met.models import load_model
from met.parallel.shard import ShardError, check_divisible

TOL = 1e-5  # float32 against float32 (Q8_0: against its own dequantized weights)
# GGUF blocks: activations quantized to int8 per 32-block (and, in C++, K/V to fp16); measured
# 2.0e-2 (torch) and 2.2e-2 (C++) of the largest logit, every greedy token the same.
BLOCKS_TOL = 3e-2
GREEDY = met.SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@torch.inference_mode()
def _logits(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # output_hidden_states keeps every prompt position through the shared-KV layers
    # (transformers 5.24 otherwise slices them, and fails without per-layer embeddings).
    return {
        name: model(torch.tensor([ids]), output_hidden_states=True).logits[0].float()
        for name, ids in SEQS.items()
    }


@pytest.mark.parametrize("variant", ["dense", "moe", "k_as_v", "ple32"])
@pytest.mark.parametrize("kind", ["hf", "f32", "q8_0"])
def test_gemma4_matches_transformers(tmp_path, kind, variant):
    model = _variant(variant)
    if kind == "hf":
        path, reference = save_hf(model, tmp_path / "gemma4"), model
    else:
        path = write_gemma4_gguf(model, tmp_path / "g.gguf", getattr(Q, kind.upper()))
        reference = dequantized(model, path) if kind == "q8_0" else model
    assert max(len(ids) for ids in SEQS.values()) > 2 * WINDOW
    # The C++ CPU forward runs every kind over GGUF blocks but the dense fixture's per-layer
    # embeddings, 8 wide (kept float32: the matmuls' blocks are 32); the torch forward runs it.
    blocks = kind == "q8_0"
    names = assert_matches_transformers(path, _logits(reference), BLOCKS_TOL if blocks else TOL)
    assert names == (["torch", "cpp"] if blocks and variant != "dense" else ["torch"])


def _variant(variant: str) -> torch.nn.Module:
    if variant == "moe":
        return gemma4(moe=True)
    if variant == "ple32":  # E2B's kind, its per-layer inputs as wide as a block
        return gemma4(hidden_size_per_layer_input=32)
    return gemma4(**(LIKE_31B if variant == "k_as_v" else {}))


def test_the_multimodal_gemma4_folder_serves_its_text_model(tmp_path):
    # As the released checkpoints (Gemma4ForConditionalGeneration): the text model under
    # model.language_model, its config under text_config; the vision tower is not read.
    model = gemma4()
    folder = save_hf(model, tmp_path / "gemma4")
    raw = json.loads((folder / "config.json").read_text())
    wrapped = {"model_type": "gemma4", "text_config": raw, "vision_config": {"hidden_size": 8}}
    (folder / "config.json").write_text(json.dumps(wrapped))
    tensors = load_file(str(folder / "model.safetensors"))
    renamed = {"model.language_model." + n.removeprefix("model."): t for n, t in tensors.items()}
    renamed["model.vision_tower.patch_embedder.input_proj.weight"] = torch.zeros(8, 8)
    save_file(renamed, str(folder / "model.safetensors"))
    assert read_hf_config(folder).family == "gemma4"
    assert assert_matches_transformers(folder, _logits(model), TOL) == ["torch"]
    # The per-layer-embedding tables count among the weights the capacity plan reports.
    _, loaded, _ = load_model(folder, device="cpu")
    ple = loaded.ple.embed.numel() + loaded.ple.model_proj.numel() + loaded.ple.norm.numel()
    counted = weight_bytes(loaded)
    loaded.ple = None
    assert counted - weight_bytes(loaded) == 4 * ple


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_gemma4_plan_is_the_same_from_both_formats(tmp_path, moe):
    model = gemma4(moe)
    gguf_path = write_gemma4_gguf(model, tmp_path / "g.gguf", Q.F32)
    from_gguf, _ = load_gguf(gguf_path)  # with rope_freqs, which read_config leaves out
    from_hf = read_hf_config(save_hf(model, tmp_path / "hf"))
    assert from_gguf.layers == from_hf.layers
    specs = from_hf.layers
    assert [s.window for s in specs] == [WINDOW, None] * 3
    assert [s.head_dim for s in specs] == [16, None] * 3 and from_hf.head_dim == 32
    assert [s.kv_source for s in specs] == [None] * 4 + [2, 3]
    assert [s.k_as_v for s in specs] == [False, moe] * 2 + [False] * 2
    assert from_hf.n_kv_heads == (1 if moe else 2)
    for c in (from_gguf, from_hf):
        assert (c.n_experts, c.per_layer_dim) == ((4, 0) if moe else (0, 8))
        assert c.query_scale == 1.0 and c.final_softcap == 30.0 and c.activation == "gelu_tanh"
        assert c.embed_scale == pytest.approx(math.sqrt(64))
    # Proportional RoPE: 4 of the global layers' 16 pairs turn, at base ** (-2i / 32).
    freqs = [1e6 ** (-2 * i / 32) for i in range(4)] + [0.0] * 12
    assert from_hf.inv_freq() == pytest.approx(freqs, abs=1e-20)
    assert from_gguf.inv_freq() == pytest.approx(freqs, abs=1e-20)
    assert from_hf.inv_freq(True, 16) == pytest.approx([1e4 ** (-2 * i / 16) for i in range(8)])


def test_gemma4_capability(tmp_path):
    dense = read_hf_config(save_hf(gemma4(), tmp_path / "dense"))
    moe = read_hf_config(save_hf(gemma4(moe=True), tmp_path / "moe"))
    like_31b = read_hf_config(save_hf(gemma4(**LIKE_31B), tmp_path / "31b"))
    assert missing(like_31b, "torch") == [] and missing(like_31b, "cpu") == []
    assert {LAYER_HEADS, SHARED_KV, K_AS_V, V_NORM} <= set(model_features(like_31b))
    assert missing(dense, "torch") == [] and missing(moe, "torch") == []
    assert missing(dense, "cpu") == [] and PER_LAYER_INPUTS in model_features(dense)
    assert {DENSE_AND_MOE, SCALED_ROUTER} <= set(model_features(moe))
    assert missing(moe, "cpu") == [] and refusal(moe, "cpu") is None
    assert missing(moe, "cuda")[-2:] == [DENSE_AND_MOE, SCALED_ROUTER]
    assert refusal(moe, "cuda").endswith("the torch forward runs it (--weight-format dequantized)")


def test_gemma4_is_refused_over_several_ranks(tmp_path):
    config = read_hf_config(save_hf(gemma4(), tmp_path / "dense"))
    check_divisible(config, 1)
    with pytest.raises(ShardError, match="Gemma 4"):
        check_divisible(config, 2)


def test_shared_kv_layers_own_no_pages(tmp_path):
    config = read_hf_config(save_hf(gemma4(moe=True), tmp_path / "moe"))
    cache = PagedKvCache.allocate(config, num_blocks=3, block_size=4)
    # Sliding layers 0 and 2 ([2 KV heads, 16]), global 1 and 3 ([1, 32]); 4 and 5 read 2 and 3.
    assert cache.k.shape == (2, 3, 4, 2, 16) and cache.others[0][0].shape == (2, 3, 4, 1, 32)
    for shared, source in ((4, 2), (5, 3)):
        assert cache.layer_slots(shared)[0].data_ptr() == cache.layer_slots(source)[0].data_ptr()
        assert cache.layer_slots(shared)[1].data_ptr() == cache.layer_slots(source)[1].data_ptr()
    distinct = {cache.layer_slots(i)[0].data_ptr() for i in range(4)}
    assert len(distinct) == 4
    # The capacity plan counts what the pool holds: 2 (K, V) x (2 x 2 x 16 + 2 x 1 x 32) floats.
    shape = pool_shape(config, element=4, block_size=4, max_model_len=16, tp_size=1)
    held = sum(t.numel() * t.element_size() for t in (cache.k, cache.v, *cache.others[0]))
    assert shape.block_bytes == held // 3 == 2 * (2 * 2 * 16 + 2 * 1 * 32) * 4 * 4


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("g4") / "g.gguf"
    return write_gemma4_gguf(gemma4(moe=True), path, template=TEMPLATE)


@pytest.mark.parametrize("variant", ["moe", "k_as_v"])
def test_gemma4_prefix_hit_equals_miss_and_batching_changes_nothing(gguf_file, tmp_path, variant):
    # Both run the C++ forward over the GGUF blocks (the engine's pick for such a file).
    path = gguf_file if variant == "moe" else write_gemma4_gguf(_variant(variant), tmp_path / "k")
    llm = met.LLM(model=str(path), device="cpu", block_size=4)
    try:
        assert type(llm.engine.backend.model).__name__ == "CpuLlama"
        prompts = [list(range(5, 5 + n)) for n in (23, 9, 17)]
        miss = llm.generate(prompt_token_ids=[prompts[0]], sampling_params=GREEDY)[0]
        hit = llm.generate(prompt_token_ids=[prompts[0]], sampling_params=GREEDY)[0]
        assert miss.usage["cached_tokens"] == 0 and hit.usage["cached_tokens"] >= 20
        assert hit.outputs[0].token_ids == miss.outputs[0].token_ids
        alone = [llm.generate(prompt_token_ids=[p], sampling_params=GREEDY)[0] for p in prompts]
        batch = llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY)
        assert [o.outputs[0].token_ids for o in alone] == [o.outputs[0].token_ids for o in batch]
    finally:
        llm.close()


def test_gemma4_preempted_sequences_resume_unchanged(gguf_file, monkeypatch):
    from met.config import EngineConfig
    from met.engine.core import EngineCore
    from met.engine.torch_backend import TorchBackend

    # Every decode plan through the Python backend, where exhaust_kv_once fails one.
    monkeypatch.setattr(TorchBackend, "for_scheduler", lambda self: self)
    engine = EngineCore(EngineConfig(model=str(gguf_file), device="cpu", block_size=4))
    backend = engine.backend

    def run(names: list[str]) -> dict[str, list[int]]:
        tokens: dict[str, list[int]] = {name: [] for name in names}
        for name in names:
            engine.add_request(name, list(range(7, 20)), GREEDY)
        while engine.has_work():
            for delta in engine.step():
                tokens[delta.request_id] += delta.token_ids
        return tokens

    want = run(["alone"])["alone"]
    calls = exhaust_kv_once(backend, 3)
    tokens = run([f"r{i}" for i in range(3)])
    assert len(calls) > 3 and len(want) == 10
    assert engine.scheduler.stats().preemptions == engine.stats().preemptions == 1
    assert all(t == want for t in tokens.values())


@pytest.mark.slow
def test_met_serve_chats_with_gemma4(gguf_file):
    assert_serves_chat(gguf_file, "gemma4")
