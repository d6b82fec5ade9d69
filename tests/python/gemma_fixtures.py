"""Tiny random-weight Gemma 2 and Gemma 3 models: a Hugging Face config and state dict (the truth
gemma_reference runs on), written as an HF folder or as the GGUF llama.cpp's converter makes of
it (its tensor and key names, norms stored as 1 + w)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf_writing import Q, add_attention, add_bpe_tokenizer, add_shape, bpe_vocab, finish, store
from model_fixtures import byte_tokenizer_json
from safetensors.torch import save_file

WINDOW = 6  # short, so the tests' sequences run past it
SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
# A Gemma-3-style template: a system message is folded into the first user turn, the assistant
# is called "model", turns must alternate, and the rendered text starts with BOS.
TEMPLATE = """{{ bos_token }}
{%- set system = '' %}
{%- set turns = messages %}
{%- if messages and messages[0].role == 'system' %}
{%- set system = messages[0].content + '\\n\\n' %}
{%- set turns = messages[1:] %}
{%- endif %}
{%- for message in turns %}
{%- if (message.role == 'user') != (loop.index0 % 2 == 0) %}
{{- raise_exception('Gemma turns must alternate user, assistant, user, ...') }}
{%- endif %}
{%- set role = 'model' if message.role == 'assistant' else message.role %}
{{- '<start_of_turn>' + role + '\\n' + (system if loop.first else '') }}
{{- message.content | trim + '<end_of_turn>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"""

_COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "sliding_window": WINDOW,
    "query_pre_attn_scalar": 16,  # = head_dim: what a GGUF file implies (it has no such key)
    "hidden_activation": "gelu_pytorch_tanh",
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "tie_word_embeddings": True,
}
# Soft-caps small enough to change these random models' outputs (Gemma 2 ships 50 and 30).
CONFIGS = {
    "gemma2": {
        "model_type": "gemma2",
        "architectures": ["Gemma2ForCausalLM"],
        "num_hidden_layers": 2,  # sliding, global (the default alternation)
        "rope_theta": 10000.0,
        "attn_logit_softcapping": 3.0,
        "final_logit_softcapping": 8.0,
    },
    "gemma3": {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "num_hidden_layers": 3,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},  # global layers only
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
    },
}
_HF_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gemma_config(family: str, **overrides: object) -> dict:
    return {**_COMMON, "vocab_size": len(bpe_vocab(SPECIALS)), **CONFIGS[family], **overrides}


def gemma_weights(config: dict, seed: int = 7, varied: bool = False) -> dict[str, torch.Tensor]:
    """HF-named random weights; norm weights w near 0 (Gemma's norms scale by 1 + w).

    At unit scale, times sqrt(hidden), a token's own embedding dominates its residual and the
    tied head picks that token again: greedy continuations repeat one token whatever attention
    (windowed or not) computed, while logits still depend on all of it. `varied`: embeddings
    small beside the post-normed sublayers, and a final norm of about 4 to keep the logits a few
    units wide, so continuations vary and a window changes them (benchmarks/fidelity.py); the
    logits are flatter, so int8 activations move them more relative to their range."""
    gen = torch.Generator().manual_seed(seed)
    hidden, hd, ffn = config["hidden_size"], config["head_dim"], config["intermediate_size"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd

    def mat(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) / cols**0.5

    def norm(n: int) -> torch.Tensor:
        return 0.1 * torch.randn(n, generator=gen)

    embed = torch.randn(config["vocab_size"], hidden, generator=gen) / (32 if varied else 4)
    w = {"model.embed_tokens.weight": embed, "model.norm.weight": norm(hidden) + 3.0 * varied}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w |= {
            p + "input_layernorm.weight": norm(hidden),
            p + "self_attn.q_proj.weight": mat(q, hidden),
            p + "self_attn.k_proj.weight": mat(kv, hidden),
            p + "self_attn.v_proj.weight": mat(kv, hidden),
            p + "self_attn.o_proj.weight": mat(hidden, q),
            p + "post_attention_layernorm.weight": norm(hidden),
            p + "pre_feedforward_layernorm.weight": norm(hidden),
            p + "post_feedforward_layernorm.weight": norm(hidden),
            p + "mlp.gate_proj.weight": mat(ffn, hidden),
            p + "mlp.up_proj.weight": mat(ffn, hidden),
            p + "mlp.down_proj.weight": mat(hidden, ffn),
        }
        if config["model_type"].startswith("gemma3"):
            w |= {p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd)}
    return w


def write_gemma_hf(folder: Path, family: str, **overrides: object) -> tuple[dict, dict]:
    config = gemma_config(family, **overrides)
    weights = gemma_weights(config)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(byte_tokenizer_json())
    settings = {"chat_template": TEMPLATE, "bos_token": None, "eos_token": None}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return config, weights


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    _, _, i, rest = hf_name.split(".", 3)
    return f"blk.{i}.{_HF_TO_GGUF[rest.removesuffix('.weight')]}.weight"


def write_gemma_gguf(
    path: Path, family: str, qtype: Q = Q.Q8_0, varied: bool = False, **overrides: object
) -> tuple[dict, dict]:
    """The HF model as llama.cpp's converter writes it (norms as 1 + w, in F32)."""
    config = gemma_config(family, **overrides)
    weights = gemma_weights(config, varied=varied)
    c = config
    w = gguf.GGUFWriter(str(path), family)
    add_shape(
        w,
        c["num_hidden_layers"],
        c["max_position_embeddings"],
        c["hidden_size"],
        c["intermediate_size"],
    )
    heads = (c["num_attention_heads"], c["num_key_value_heads"])
    add_attention(w, *heads, c["rope_theta"], c["rms_norm_eps"], head_dim=c["head_dim"])
    w.add_sliding_window(c["sliding_window"])
    if family == "gemma2":
        # Absent keys mean llama.cpp's defaults (50, 30); a cap of 0 switches it off.
        w.add_attn_logit_softcapping(c["attn_logit_softcapping"] or 0.0)
        w.add_final_logit_softcapping(c["final_logit_softcapping"] or 0.0)
    else:
        w.add_sliding_window_pattern(3)  # layers 0, 1 slide, 2 is global
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(c["rope_scaling"]["factor"])
    add_bpe_tokenizer(w, "default", bos=2, eos=1, specials=SPECIALS)
    w.add_add_bos_token(False)  # the template writes BOS
    w.add_chat_template(TEMPLATE)
    for name, tensor in weights.items():
        norm = name.endswith("norm.weight")
        store(w, gguf_name(name), tensor + 1.0 if norm else tensor, Q.F32 if norm else qtype)
    finish(w)
    return config, weights


def dequantized_hf_weights(path: Path, config: dict) -> dict[str, torch.Tensor]:
    """The GGUF file's tensors back under their HF names (norms as w again): the weights the
    file's quantized matmuls effectively run, for the reference."""
    reader = gguf.GGUFReader(str(path))
    by_gguf = {gguf_name(n): n for n in gemma_weights(config, seed=0)}
    out = {}
    for t in reader.tensors:
        array = gguf.quants.dequantize(t.data, t.tensor_type).reshape(
            [int(d) for d in reversed(t.shape)]
        )
        tensor = torch.from_numpy(np.array(array, dtype=np.float32))
        name = by_gguf[t.name]
        out[name] = tensor - 1.0 if name.endswith("norm.weight") else tensor
    return out
