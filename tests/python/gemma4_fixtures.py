"""Tiny Gemma 4 models built by transformers (Gemma4ForCausalLM, float32, seeded weights), dense
(with per-layer embeddings, as E2B/E4B) and MoE (K as V and fewer KV heads in the global layers,
as 26B-A4B), each with sliding and global layers of their own head widths and two shared-KV
layers; saved as an HF folder, and written as a GGUF file the way llama.cpp's converter
(conversion/gemma.py, Gemma4Model) names, shapes and annotates them."""

from __future__ import annotations

from pathlib import Path

import gguf
import torch
from gguf_writing import Q, add_bpe_tokenizer, add_shape, finish, store
from hf_reference import SHAPE, build_hf

from met.gguf_loader import load_gguf

WINDOW = 6  # the tests' prompts (11 and 18 tokens) run past it
# Sliding and global alternate so that the last two layers owning KV are sliding then global,
# where transformers' and llama.cpp's choices of the layer a shared one reads agree.
TYPES = ["sliding_attention", "full_attention"] * 3
ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.25,
        "rope_theta": 1000000.0,
    },
}
COMMON = {
    "num_hidden_layers": len(TYPES),
    "layer_types": TYPES,
    "global_head_dim": 2 * SHAPE["head_dim"],
    "sliding_window": WINDOW,
    "rope_parameters": ROPE,
    "num_kv_shared_layers": 2,
    "final_logit_softcapping": 30.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
DENSE = {
    **COMMON,
    "hidden_size_per_layer_input": 8,
    "vocab_size_per_layer_input": SHAPE["vocab_size"],
}
# The 31B's kind: no per-layer embeddings nor MoE; its global layers take V from K, with fewer
# KV heads (the layers the C++ CPU forward runs too).
LIKE_31B = {
    **COMMON,
    "hidden_size_per_layer_input": 0,
    "attention_k_eq_v": True,
    "num_global_key_value_heads": 1,
}
MOE = {
    **COMMON,
    "hidden_size_per_layer_input": 0,
    "enable_moe_block": True,
    "num_experts": 4,
    "top_k_experts": 2,
    "moe_intermediate_size": 32,
    "attention_k_eq_v": True,
    "num_global_key_value_heads": 1,
}


def gemma4(moe: bool = False, seed: int = 3, **overrides: object) -> torch.nn.Module:
    """The tiny model (overrides: LIKE_31B's kind, say); expert weights ~ N(0, 1 / fan_in), layer
    output and expert scales in [0.5, 1.5] (build_hf leaves these at N(0, 1) and 1), routers 16
    times build_hf's: logits of ~2 apart, as a trained router's, where build_hf's ~0.1 leave
    the top-k so near a tie that the blocks' int8 rounding picks other experts."""
    model = build_hf("gemma4_text", seed=seed, **{**(MOE if moe else DENSE), **overrides})
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                tensor.div_(tensor.shape[-1] ** 0.5)
            elif name.endswith(("layer_scalar", "per_expert_scale")):
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=gen))
            elif name.endswith("router.proj.weight"):
                tensor.mul_(16.0)
    return model


_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "layer_scalar": "layer_output_scale.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
}
# Written in float32 whatever the file's format: norms and scales (llama.cpp's converter keeps
# 1-D tensors in F32).
_FLOAT = ("norm.weight", "layer_output_scale.weight", ".scale")


def write_gemma4_gguf(
    model: torch.nn.Module,
    path: Path,
    qtype: Q = Q.Q8_0,
    specials: list[str] | None = None,
    template: str | None = None,
    overrides: dict | None = None,
) -> Path:
    """The model as llama.cpp's converter writes it, with the tests' byte-level vocabulary
    (`specials` first: bos 0 and eos 2 without them, else Gemma's <bos> and <eos>);
    `overrides`: the ones the model was built with, where they change its head widths."""
    c = model.config
    sliding = [t == "sliding_attention" for t in c.layer_types]
    # transformers' config has no single head_dim (nor KV heads) any more: the overrides'.
    settings = {**SHAPE, **(LIKE_31B if c.attention_k_eq_v else DENSE), **(overrides or {})}
    full_dim, swa_dim = settings["global_head_dim"], settings["head_dim"]
    w = gguf.GGUFWriter(str(path), "gemma4")
    add_shape(w, c.num_hidden_layers, c.max_position_embeddings, c.hidden_size, c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    swa_kv = settings["num_key_value_heads"]
    if c.attention_k_eq_v:
        full_kv = settings["num_global_key_value_heads"]
        w.add_head_count_kv([swa_kv if s else full_kv for s in sliding])
    else:
        w.add_head_count_kv(swa_kv)
    w.add_key_length(full_dim)
    w.add_value_length(full_dim)
    w.add_key_length_swa(swa_dim)
    w.add_value_length_swa(swa_dim)
    w.add_rope_dimension_count(full_dim)
    w.add_rope_dimension_count_swa(swa_dim)
    w.add_rope_freq_base(ROPE["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(ROPE["sliding_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_sliding_window(c.sliding_window)
    w.add_sliding_window_pattern(sliding)
    w.add_shared_kv_layers(c.num_kv_shared_layers)
    w.add_embedding_length_per_layer_input(c.hidden_size_per_layer_input or 0)
    w.add_final_logit_softcapping(c.final_logit_softcapping)
    if c.enable_moe_block:
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.top_k_experts)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    if specials is None:
        add_bpe_tokenizer(w, "qwen2", bos=0, eos=2)
    else:
        add_bpe_tokenizer(w, "qwen2", specials.index("<bos>"), specials.index("<eos>"), specials)
    if template is not None:
        w.add_chat_template(template)
    # Proportional RoPE: 1 for the rotated pairs of the global layers, 1e30 for the others.
    rotated = int(ROPE["full_attention"]["partial_rotary_factor"] * full_dim // 2)
    freqs = torch.tensor([1.0] * rotated + [1e30] * (full_dim // 2 - rotated))
    store(w, "rope_freqs.weight", freqs, Q.F32)
    for name, tensor in model.state_dict().items():
        gguf_name = _gguf_name(name)
        if gguf_name is not None:
            small = tensor.dim() == 1 or tensor.shape[-1] % 32  # no whole Q8_0 block
            kind = Q.F32 if gguf_name.endswith(_FLOAT) or small else qtype
            store(w, gguf_name, tensor.float(), kind)
    finish(w)
    return path


def _gguf_name(name: str) -> str | None:
    if name in _GLOBAL:
        return _GLOBAL[name]
    if not name.startswith("model.layers."):
        return None  # lm_head: tied
    _, _, i, suffix = name.split(".", 3)
    return f"blk.{i}.{_LAYER[suffix]}"


def dequantized(model: torch.nn.Module, path: Path) -> torch.nn.Module:
    """`model` with the weights of the GGUF file at `path` as met dequantizes them, so that a
    quantized file is checked against transformers on the same numbers."""
    _, weights = load_gguf(path)
    state = model.state_dict()
    n_experts = model.config.num_experts or 0
    with torch.no_grad():
        state["model.embed_tokens.weight"].copy_(weights["embed"])
        for i in range(model.config.num_hidden_layers):
            p, hf = f"layers.{i}.", f"model.layers.{i}."
            for short, suffix in (
                ("wq", "self_attn.q_proj"),
                ("wk", "self_attn.k_proj"),
                ("wv", "self_attn.v_proj"),
                ("wo", "self_attn.o_proj"),
                ("w_gate", "mlp.gate_proj"),
                ("w_up", "mlp.up_proj"),
                ("w_down", "mlp.down_proj"),
                ("router", "router.proj"),
                ("ple_gate", "per_layer_input_gate"),
                ("ple_proj", "per_layer_projection"),
            ):
                if p + short in weights:
                    state[f"{hf}{suffix}.weight"].copy_(weights[p + short])
            if n_experts:
                e = range(n_experts)
                gate_up = [
                    torch.cat([weights[f"{p}experts.{x}.w_gate"], weights[f"{p}experts.{x}.w_up"]])
                    for x in e
                ]
                state[hf + "experts.gate_up_proj"].copy_(torch.stack(gate_up))
                down = [weights[f"{p}experts.{x}.w_down"] for x in e]
                state[hf + "experts.down_proj"].copy_(torch.stack(down))
        if "ple_model_proj" in weights:
            state["model.per_layer_model_projection.weight"].copy_(weights["ple_model_proj"])
            state["model.embed_tokens_per_layer.weight"].copy_(weights["ple_embed"])
    return model
