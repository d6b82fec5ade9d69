"""Tiny random-weight models of each family met runs, written as GGUF files (through the `gguf`
package's writer, the way llama.cpp's converter names things) and as Hugging Face folders."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import torch
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
from model_fixtures import byte_tokenizer_json, random_weights, save_hf_folder, tiny_config
from moe_fixtures import (
    MIXTRAL_TEMPLATE,
    MOE_SHAPE,
    add_experts,
    add_gguf_metadata,
    dense_only,
    gguf_experts,
    hf_experts,
)
from safetensors.torch import load_file, save_file

from met.model.config import ModelConfig

# A Qwen3-style chat template: the system turn, assistant turns with their reasoning dropped
# from history, and an empty think block when thinking is switched off.
QWEN3_TEMPLATE = """{%- for message in messages %}
{%- if message.role == 'assistant' %}
{%- set content = message.content %}
{%- if '</think>' in content %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}"""

PHI3_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + "
    "'<|end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
# Phi-3's LongRoPE on the tiny model: a context of 256 over an original 64, so the long factors
# apply, and cos/sin scale by sqrt(1 + ln(256 / 64) / ln(64)) as llama.cpp's converter derives.
PHI3_ORIGINAL = 64
PHI3_LONG = [1.0, 1.1, 1.3, 1.6, 2.0, 2.6, 3.4, 4.5]
PHI3_SHORT = [1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5]

QWEN3_RENDERED = (
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
    "<|im_start|>user\nworld<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
# Per family: the config overrides of its tiny model (architecture: the HF model_type), its GGUF
# architecture name, its template, and what that template makes of test_families' conversation.
FAMILIES: dict[str, dict] = {
    "qwen3moe": {
        "config": {"architecture": "qwen3_moe", "qk_norm": True, "head_dim": 32, **MOE_SHAPE},
        "arch": "qwen3moe",
        "template": QWEN3_TEMPLATE,
        "rendered": QWEN3_RENDERED,
    },
    # Mixtral's GGUF files are `llama` ones with experts (Q/K rows permuted as llama's are).
    "mixtral": {
        "config": {"architecture": "mixtral", **MOE_SHAPE},
        "arch": "llama",
        "template": MIXTRAL_TEMPLATE,
        "rendered": "<|endoftext|>[INST] hello [/INST]<think>\nhm\n</think>\n\nhello<|im_end|>"
        "[INST] world [/INST]",
    },
    "qwen3": {
        "config": {"architecture": "qwen3", "qk_norm": True, "head_dim": 32, "n_kv_heads": 2},
        "arch": "qwen3",
        "template": QWEN3_TEMPLATE,
        "rendered": QWEN3_RENDERED,
    },
    "qwen2": {
        "config": {"architecture": "qwen2", "attention_bias": True},
        "arch": "qwen2",
        "template": QWEN3_TEMPLATE,
        "rendered": QWEN3_RENDERED,
    },
    "phi3": {
        "config": {
            "architecture": "phi3",
            "tie_embeddings": False,
            "rope_freq_factors": PHI3_LONG,
            "rope_attn_factor": math.sqrt(1 + math.log(256 / PHI3_ORIGINAL) / math.log(64)),
        },
        "arch": "phi3",
        "template": PHI3_TEMPLATE,
        "rendered": "<|user|>\nhello<|end|>\n<|assistant|>\n<think>\nhm\n</think>\n\nhello"
        "<|end|>\n<|user|>\nworld<|end|>\n<|assistant|>\n",
    },
}
_GGUF_LAYER = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight",
    "wk": "attn_k.weight",
    "wv": "attn_v.weight",
    "bq": "attn_q.bias",
    "bk": "attn_k.bias",
    "bv": "attn_v.bias",
    "qkv": "attn_qkv.weight",
    "gate_up": "ffn_up.weight",
    "q_norm": "attn_q_norm.weight",
    "k_norm": "attn_k_norm.weight",
    "wo": "attn_output.weight",
    "mlp_norm": "ffn_norm.weight",
    "w_gate": "ffn_gate.weight",
    "w_up": "ffn_up.weight",
    "w_down": "ffn_down.weight",
}
_LINEAR = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def family_model(family: str, vocab: int, seed: int = 5, **shape: int) -> tuple[ModelConfig, dict]:
    """The family's tiny model; `shape` overrides tiny_config's sizes."""
    overrides = {"tie_embeddings": True, **FAMILIES[family]["config"], **shape}
    config = tiny_config(vocab=vocab, **overrides)
    weights = random_weights(config, seed=seed)
    if config.n_experts:
        add_experts(config, weights, seed)
    return config, weights


def write_family_gguf(
    path: Path,
    family: str,
    qtype: Q = Q.Q8_0,
    extra: dict[str, torch.Tensor] | None = None,
    metadata: dict[str, int] | None = None,
    legacy_experts: bool = False,
    split_max_tensors: int = 0,
    **shape: int,
) -> tuple[ModelConfig, dict]:
    """The family's tiny model as llama.cpp's converter writes it: linear weights in `qtype`,
    norms in F32, a byte-level BPE vocabulary with the chat tokens and template; `metadata`
    keys added as uint32 values; a MoE's experts one tensor each with legacy_experts; `extra`
    tensors (F32) added as named. With split_max_tensors, split as gguf-split does: files
    path-00001-of-0000N.gguf of at most that many tensors each, the metadata in the first."""
    spec = FAMILIES[family]
    config, weights = family_model(family, len(bpe_vocab()), **shape)
    w = gguf.GGUFWriter(str(path), spec["arch"], split_max_tensors=split_max_tensors)
    add_shape(w, config.n_layers, config.context_length, config.hidden, config.ffn)
    c = config
    add_attention(w, c.n_heads, c.n_kv_heads, c.rope_theta, c.norm_eps, head_dim=c.head_dim)
    add_bpe_tokenizer(w, "qwen2", bos=0, eos=2)
    w.add_chat_template(spec["template"])
    for key, value in (metadata or {}).items():
        w.add_uint32(key, value)
    store(w, "token_embd.weight", weights["embed"], qtype)
    if "lm_head" in weights:
        store(w, "output.weight", weights["lm_head"], qtype)
    store(w, "output_norm.weight", weights["norm"], Q.F32)
    if family == "phi3":
        _phi3_gguf_extras(w, config)
    layers = _gguf_layers(family, weights)
    if config.n_experts:
        add_gguf_metadata(w, config, spec["arch"])
        for name, tensor in gguf_experts(layers, config, legacy_experts).items():
            # llama.cpp keeps the router in F32; the experts are quantized like the rest.
            store(w, name, tensor, Q.F32 if "gate_inp" in name else qtype)
    for name, tensor in layers.items():
        short = name.rsplit(".", 1)[-1]
        kind = qtype if short in _LINEAR or short in ("qkv", "gate_up") else Q.F32
        if spec["arch"] == "llama" and short in ("wq", "wk"):
            heads = config.n_heads if short == "wq" else config.n_kv_heads
            tensor = torch.from_numpy(permute_qk(tensor.numpy(), heads))
        i = name.split(".")[1]
        store(w, f"blk.{i}.{_GGUF_LAYER[short]}", tensor, kind)
    for name, tensor in (extra or {}).items():
        store(w, name, tensor, Q.F32)
    finish(w)
    return config, weights


def _gguf_layers(family: str, weights: dict) -> dict[str, torch.Tensor]:
    """Layer tensors by canonical name; Phi-3's fused as its converter fuses them."""
    layers = {n: t for n, t in weights.items() if n.startswith("layers.")}
    if family != "phi3":
        return layers
    for i in sorted({n.split(".")[1] for n in layers}):
        p = f"layers.{i}."
        layers[p + "qkv"] = torch.cat([layers.pop(p + k) for k in ("wq", "wk", "wv")])
        layers[p + "gate_up"] = torch.cat([layers.pop(p + k) for k in ("w_gate", "w_up")])
    return layers


def _phi3_gguf_extras(w: gguf.GGUFWriter, config: ModelConfig) -> None:
    w.add_rope_dimension_count(config.head_dim)
    w.add_rope_scaling_orig_ctx_len(PHI3_ORIGINAL)
    w.add_rope_scaling_attn_factors(config.rope_attn_factor)
    w.add_tensor("rope_factors_long.weight", np.array(PHI3_LONG, dtype=np.float32))
    w.add_tensor("rope_factors_short.weight", np.array(PHI3_SHORT, dtype=np.float32))


def write_family_hf(folder: Path, family: str) -> tuple[ModelConfig, dict]:
    """The family's tiny model as a Hugging Face folder (config.json, safetensors, a byte-level
    tokenizer of 256 ids, the chat template)."""
    config, weights = family_model(family, 256)
    folder.mkdir(parents=True, exist_ok=True)
    save_hf_folder(folder, config, dense_only(weights))
    if family == "phi3":
        _phi3_hf(folder, config)
    if config.n_experts:
        hf_experts(folder, config, weights)
    (folder / "tokenizer.json").write_text(byte_tokenizer_json())
    settings = {"chat_template": FAMILIES[family]["template"], "eos_token": None}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return config, weights


def _phi3_hf(folder: Path, config: ModelConfig) -> None:
    """Phi-3's own layout of the folder save_hf_folder wrote: fused QKV and gate/up, LongRoPE."""
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    for i in range(config.n_layers):
        p = f"model.layers.{i}."
        parts = [tensors.pop(f"{p}self_attn.{k}_proj.weight") for k in "qkv"]
        tensors[p + "self_attn.qkv_proj.weight"] = torch.cat(parts)
        parts = [tensors.pop(f"{p}mlp.{k}_proj.weight") for k in ("gate", "up")]
        tensors[p + "mlp.gate_up_proj.weight"] = torch.cat(parts)
    save_file(tensors, str(path))
    raw = json.loads((folder / "config.json").read_text())
    raw["original_max_position_embeddings"] = PHI3_ORIGINAL
    raw["rope_scaling"] = {"type": "longrope", "long_factor": PHI3_LONG, "short_factor": PHI3_SHORT}
    (folder / "config.json").write_text(json.dumps(raw))
