"""A family's tiny model built by transformers (the reference independent of met's forward): its
config from a few overrides, seeded random weights in float32, saved as an HF folder and, from
the same weights, written as a GGUF file the way llama.cpp's converter names and orders them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import gguf
import torch
from family_fixtures import QWEN3_TEMPLATE
from gguf_writing import (
    Q,
    add_attention,
    add_bpe_tokenizer,
    add_shape,
    bpe_vocab,
    finish,
    permute_qk,
    store,
)
from model_fixtures import byte_tokenizer_json, paged_forwards, stepped_logits
from server_harness import start_server

import met
from met.gguf_loader import load_gguf

SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "vocab_size": len(bpe_vocab()),
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": None,
}
# HF layer tensor suffix -> GGUF layer tensor name, for the tensors these families have.
GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# Canonical layer weight name -> HF suffix (Llama's; a family passes its own differences).
HF_LAYER = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}
SEQS = {"a": list(range(3, 21)), "b": [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]}
# Chunked prefill and batching: a's prompt in three chunks, b's in two, sharing steps; then
# decode steps of both, so positions pass the tiny models' 8-token original context.
STEPS = [
    [("a", SEQS["a"][:5])],
    [("a", SEQS["a"][5:11]), ("b", SEQS["b"][:4])],
    [("b", SEQS["b"][4:9]), ("a", SEQS["a"][11:17])],
    [("a", SEQS["a"][17:]), ("b", SEQS["b"][9:10])],
    [("b", SEQS["b"][10:])],
]


def build_hf(model_type: str, seed: int = 3, **overrides: object) -> torch.nn.Module:
    """transformers' own model of `model_type`, float32, its weights seeded random: linear
    weights ~ N(0, 1 / fan_in), embeddings N(0, 1), norms 1 + N(0, 0.01)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**SHAPE, **overrides})
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            elif param.dim() == 2 and "embed" not in name:
                param.copy_(torch.randn(param.shape, generator=gen) / param.shape[1] ** 0.5)
            else:
                param.copy_(torch.randn(param.shape, generator=gen))
    return model


@torch.inference_mode()
def hf_logits(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """transformers' float32 logits of each of SEQS, one sequence at a time."""
    return {name: model(torch.tensor([ids])).logits[0].float() for name, ids in SEQS.items()}


def save_hf(model: torch.nn.Module, folder: Path) -> Path:
    """The model as an HF folder with a byte-level tokenizer and a Qwen-style chat template."""
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(byte_tokenizer_json())
    settings = {"chat_template": QWEN3_TEMPLATE, "eos_token": None}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder


def write_gguf(
    model: torch.nn.Module,
    path: Path,
    arch: str,
    qtype: Q = Q.Q8_0,
    permuted: bool = False,
    names: dict[str, str] | None = None,
    metadata=None,
    convert=None,
    tokenizer=None,
) -> Path:
    """The model's weights as llama.cpp's converter writes `arch`: linear weights in `qtype`,
    norms F32, Q/K rows interleaved when `permuted`; `names` overrides GGUF_LAYER; `metadata`
    (a function of the writer) adds the family's keys; `convert(suffix, tensor, qtype)`, where
    it returns a list of (GGUF layer tensor name, tensor, format), writes a layer tensor the
    family's own way (gpt-oss's stacked experts); `tokenizer(writer)` writes the tokenizer and
    template instead of the byte-level one with a Qwen-style template."""
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    add_shape(w, c.num_hidden_layers, c.max_position_embeddings, c.hidden_size, c.intermediate_size)
    theta = c.rope_parameters["rope_theta"]
    heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
    add_attention(w, heads, kv_heads, theta, c.rms_norm_eps, head_dim=c.head_dim)
    if tokenizer is not None:
        tokenizer(w)
    else:
        add_bpe_tokenizer(w, "qwen2", bos=0, eos=2)
        w.add_chat_template(QWEN3_TEMPLATE)
    if metadata is not None:
        metadata(w)
    layer_names = {**GGUF_LAYER, **(names or {})}
    for name, tensor in model.state_dict().items():
        tensor = tensor.float()
        if name == "model.embed_tokens.weight":
            store(w, "token_embd.weight", tensor, qtype)
        elif name == "lm_head.weight" and not c.tie_word_embeddings:
            store(w, "output.weight", tensor, qtype)
        elif name == "model.norm.weight":
            store(w, "output_norm.weight", tensor, Q.F32)
        elif name.startswith("model.layers."):
            _, _, i, suffix = name.split(".", 3)
            if permuted and suffix in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
                n = heads if suffix.startswith("self_attn.q") else kv_heads
                tensor = torch.from_numpy(permute_qk(tensor.numpy(), n))
            parts = convert(suffix, tensor, qtype) if convert is not None else None
            if parts is None:
                kind = Q.F32 if "norm" in suffix else qtype
                parts = [(layer_names[suffix], tensor, kind)]
            for gguf_name, part, kind in parts:
                store(w, f"blk.{i}.{gguf_name}", part, kind)
    finish(w)
    return path


def dequantized_reference(model: torch.nn.Module, path: Path, names: dict[str, str] | None = None):
    """`model` with the weights of the GGUF file at `path` as met dequantizes them (so a
    quantized file is checked against the same numbers); names: HF_LAYER's differences."""
    hf_names = {**HF_LAYER, **(names or {})}
    _, weights = load_gguf(path)
    state = {}
    for name, tensor in weights.items():
        if name == "embed":
            state["model.embed_tokens.weight"] = tensor
        elif name == "lm_head":
            state["lm_head.weight"] = tensor
        elif name == "norm":
            state["model.norm.weight"] = tensor
        else:
            _, i, short = name.split(".", 2)
            state[f"model.layers.{i}.{hf_names[short]}"] = tensor
    model.load_state_dict(state, strict=False)
    return model


def file_and_reference(
    model: torch.nn.Module,
    kind: str,
    folder: Path,
    gguf_file: Callable[[Q], Path],
    names: dict[str, str] | None = None,
) -> tuple[Path, torch.nn.Module]:
    """The tiny model as `kind` ("hf": a folder; "f32", "q8_0": the GGUF file gguf_file(qtype)
    writes) and the transformers model to compare it with (for Q8_0, with the file's own
    dequantized weights)."""
    if kind == "hf":
        return save_hf(model, folder), model
    path = gguf_file(getattr(Q, kind.upper()))
    return path, dequantized_reference(model, path, names) if kind == "q8_0" else model


def assert_matches_transformers(
    path: Path, want: dict[str, torch.Tensor], tol: float, weight_format: str = "auto"
) -> list:
    """met's paged forwards of the file or folder at `path` loaded in `weight_format` (torch, and
    C++ where it runs the model) against transformers' logits: each within tol x the largest
    |logit|, and the same argmax up to near-ties (where they differ, transformers' own logits of
    the two picks are within that tolerance); returns the forwards' names."""
    names = []
    for name, runner in paged_forwards(path, weight_format):
        names.append(name)
        for seq, logits in stepped_logits(runner, STEPS, want).items():
            atol = tol * want[seq].abs().max().item()
            torch.testing.assert_close(logits, want[seq], atol=atol, rtol=0, msg=f"{name} {seq}")
            ours, theirs = logits.argmax(-1), want[seq].argmax(-1)
            rows = torch.arange(len(ours))
            gap = want[seq][rows, theirs] - want[seq][rows, ours]
            assert bool((gap <= atol).all()), f"{name} {seq}: argmax {ours} vs {theirs}"
    return names


def assert_greedy_batch_invariant(
    path: Path, weight_formats: tuple[str, ...] = ("gguf", "dequantized")
) -> None:
    """Greedy tokens the same alone and batched, on each weight format."""
    for weight_format in weight_formats:
        llm = met.LLM(model=str(path), device="cpu", weight_format=weight_format)
        try:
            greedy = met.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
            prompts = [[5, 6, 7, 8, 9, 10, 11], [30, 31, 32], [50, 51, 52, 53, 54, 55, 56, 57]]
            alone = [llm.generate(prompt_token_ids=[p], sampling_params=greedy)[0] for p in prompts]
            batch = llm.generate(prompt_token_ids=prompts, sampling_params=greedy)
            assert [o.token_ids for o in alone] == [o.token_ids for o in batch]
        finally:
            llm.close()


ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]


def assert_serves_chat(path: Path, name: str) -> None:
    """`met serve --model path` answers chat through the openai client, plain and streamed."""
    server = start_server("--model", str(path), "--served-model-name", name)
    try:
        client = server.openai()
        assert [m.id for m in client.models.list().data] == [name]
        reply = client.chat.completions.create(
            model=name, messages=ASK, max_tokens=4, temperature=0
        )
        choice = reply.choices[0]
        assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
        assert 1 <= reply.usage.completion_tokens <= 4
        stream = client.chat.completions.create(
            model=name, messages=ASK, max_tokens=4, temperature=0, stream=True
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert streamed == choice.message.content
    finally:
        assert server.stop() == 0
