"""Tiny random-weight models of each family met runs, written as GGUF files (through the `gguf`
package's writer, the way llama.cpp's converter names things) and as Hugging Face folders."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from model_fixtures import byte_tokenizer_json, random_weights, save_hf_folder, tiny_config
from test_gguf import MERGES, SPECIALS, _vocab

from met.model.config import ModelConfig

Q = gguf.GGMLQuantizationType
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

# Per family: the config overrides of its tiny model, its GGUF architecture name, its template.
FAMILIES: dict[str, dict] = {
    "qwen3": {
        "config": {"architecture": "qwen3", "qk_norm": True, "head_dim": 32, "n_kv_heads": 2},
        "arch": "qwen3",
        "template": QWEN3_TEMPLATE,
        # What the template makes of test_families' conversation (thinking off).
        "rendered": "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
        "<|im_start|>user\nworld<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
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
    "q_norm": "attn_q_norm.weight",
    "k_norm": "attn_k_norm.weight",
    "wo": "attn_output.weight",
    "mlp_norm": "ffn_norm.weight",
    "w_gate": "ffn_gate.weight",
    "w_up": "ffn_up.weight",
    "w_down": "ffn_down.weight",
}
_LINEAR = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def family_model(family: str, vocab: int, seed: int = 5) -> tuple[ModelConfig, dict]:
    config = tiny_config(vocab=vocab, tie_embeddings=True, **FAMILIES[family]["config"])
    return config, random_weights(config, seed=seed)


def _store(writer: gguf.GGUFWriter, name: str, w: torch.Tensor, qtype: Q) -> None:
    array = w.numpy().astype(np.float32)
    if qtype == Q.F32:
        writer.add_tensor(name, array)
    else:
        writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)


def write_family_gguf(
    path: Path, family: str, qtype: Q = Q.Q8_0, extra: dict[str, torch.Tensor] | None = None
) -> tuple[ModelConfig, dict]:
    """The family's tiny model as llama.cpp's converter writes it: linear weights in `qtype`,
    norms in F32, a byte-level BPE vocabulary with the chat tokens and template; `extra`
    tensors (F32) added as named."""
    spec = FAMILIES[family]
    tokens = _vocab()
    config, weights = family_model(family, len(tokens))
    w = gguf.GGUFWriter(str(path), spec["arch"])
    w.add_block_count(config.n_layers)
    w.add_context_length(config.context_length)
    w.add_embedding_length(config.hidden)
    w.add_feed_forward_length(config.ffn)
    w.add_head_count(config.n_heads)
    w.add_head_count_kv(config.n_kv_heads)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_chat_template(spec["template"])
    _store(w, "token_embd.weight", weights["embed"], qtype)
    _store(w, "output_norm.weight", weights["norm"], Q.F32)
    for name, tensor in weights.items():
        if name.startswith("layers."):
            _, i, short = name.split(".")
            kind = qtype if short in _LINEAR else Q.F32
            _store(w, f"blk.{i}.{_GGUF_LAYER[short]}", tensor, kind)
    for name, tensor in (extra or {}).items():
        _store(w, name, tensor, Q.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return config, weights


def write_family_hf(folder: Path, family: str) -> tuple[ModelConfig, dict]:
    """The family's tiny model as a Hugging Face folder (config.json, safetensors, a byte-level
    tokenizer of 256 ids, the chat template)."""
    config, weights = family_model(family, 256)
    folder.mkdir(parents=True, exist_ok=True)
    save_hf_folder(folder, config, weights)
    (folder / "tokenizer.json").write_text(byte_tokenizer_json())
    settings = {"chat_template": FAMILIES[family]["template"], "eos_token": None}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return config, weights
