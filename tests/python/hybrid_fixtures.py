"""Tiny Qwen3.5 / Qwen3.5-MoE / Qwen3-Next models built by transformers (seeded random weights,
float32), and their GGUF files written as llama.cpp's converter writes them (convert_hf_to_gguf.py:
Qwen3NextModel, _LinearAttentionVReorderBase): A_log as -exp(A_log), dt_bias as ssm_dt.bias,
the conv squeezed, (1 + w) folded into every norm but the DeltaNet's gated one, Qwen3-Next's
in_proj_qkvz split into attn_qkv and attn_gate, and for Qwen3.5 the value heads tiled."""

from __future__ import annotations

from pathlib import Path

import gguf
import torch
from gguf_writing import (
    SPECIALS,
    Q,
    add_attention,
    add_bpe_tokenizer,
    add_shape,
    bpe_vocab,
    finish,
    store,
)
from hf_reference import build_hf

# Qwen3.5's chat template in its parts that matter here (Qwen3-Coder's XML tool calls, which
# pick the qwen3_coder parser; the generation prompt opening <think>, or an empty think block
# with enable_thinking=false), shortened.
QWEN35_TEMPLATE = """
{%- if tools %}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You have access to the following functions:

<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

If you choose to call a function ONLY reply in the following format with NO suffix:

<tool_call>
<function=example_function_name>
<parameter=example_parameter_1>
value_1
</parameter>
</function>
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'tool' %}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == 'assistant' %}
<|im_start|>assistant
{{ message.content or '' }}
{%- for call in message.tool_calls or [] %}
<tool_call>
<function={{ call.function.name }}>
{% for name, value in call.function.arguments.items() %}<parameter={{ name }}>
{{ value }}
</parameter>
{% endfor %}</function>
</tool_call>
{%- endfor %}<|im_end|>
{% else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% else %}<think>
{% endif %}
{%- endif %}
""".lstrip("\n")
# Qwen's markers are single tokens (its tokenizer's added tokens): the thinking budget and the
# forced call's grammar name them by id.
MARKERS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
HF_TYPES = {"qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text", "qwen3next": "qwen3_next"}
HYBRID = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "tie_word_embeddings": False,
    "vocab_size": len(bpe_vocab(SPECIALS + MARKERS)),
}
MOE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
}
# Per layer: HF suffix -> GGUF name, for the tensors every one of these archs stores as is.
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
}


def build(arch: str, seed: int = 3, **overrides: object) -> torch.nn.Module:
    """transformers' tiny model of `arch` ("qwen35", "qwen35moe", "qwen3next"): hf_reference's
    seeded weights, the stacked experts and the conv scaled by 1 / sqrt(fan-in) like the other
    matrices (N(0, 1) would saturate every SiLU), the (1 + w) norms' w around 0 (scales around
    1, as trained models have them: around 2, every layer would double the activations)."""
    overrides = {**HYBRID, **(MOE if arch != "qwen35" else {}), **overrides}
    model = build_hf(HF_TYPES[arch], seed=seed, **overrides)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 3:
                param.div_(param.shape[-1] ** 0.5)
            if name.endswith("A_log"):
                param.mul_(0.5)  # decays exp(-exp(A_log) softplus(.)) mostly in (0.1, 1)
            if "norm" in name and "linear_attn.norm" not in name:
                param.sub_(1.0)
    return model


def rounded_like_gguf(model: torch.nn.Module, qtype: Q) -> torch.nn.Module:
    """`model` with every weight write_gguf stores in `qtype` rounded through it, in place: the
    reference for a quantized file of an arch whose converter only moves whole rows (Qwen3-Next;
    Qwen3.5's tiling moves out_proj's columns, so its blocks hold other elements)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() < 2 or any(n in name for n in ("norm", "conv1d", "shared_expert_gate")):
                continue
            blocks = gguf.quants.quantize(param.numpy(), qtype)
            param.copy_(torch.from_numpy(gguf.quants.dequantize(blocks, qtype)))
    return model


def write_gguf(
    model: torch.nn.Module, path: Path, arch: str, qtype: Q = Q.F32, mtp: bool = False
) -> Path:
    """The model as llama.cpp's converter writes `arch`, linear weights in `qtype`; with `mtp`
    a multi-token-prediction block after the decoder's (random tensors of its names)."""
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    blocks = c.num_hidden_layers + int(mtp)
    add_shape(w, blocks, c.max_position_embeddings, c.hidden_size, c.intermediate_size)
    if mtp:
        w.add_nextn_predict_layers(1)
        mtp_block = f"blk.{c.num_hidden_layers}."
        store(
            w,
            mtp_block + "nextn.eh_proj.weight",
            torch.randn(c.hidden_size, 2 * c.hidden_size),
            Q.F32,
        )
        store(w, mtp_block + "attn_norm.weight", torch.ones(c.hidden_size), Q.F32)
    theta = c.rope_parameters["rope_theta"]
    add_attention(
        w, c.num_attention_heads, c.num_key_value_heads, theta, c.rms_norm_eps, c.head_dim
    )
    rope_dims = int(c.head_dim * c.rope_parameters["partial_rotary_factor"])
    w.add_rope_dimension_count(rope_dims)
    if arch != "qwen3next":
        # Qwen3.5's multimodal RoPE sections (llama.cpp requires the key); for text, whose
        # positions are the same in every section, it is the plain rotation met runs.
        pairs = rope_dims // 2
        w.add_rope_dimension_sections([pairs - 2 * (pairs // 3), pairs // 3, pairs // 3, 0])
    w.add_ssm_conv_kernel(c.linear_conv_kernel_dim)
    w.add_ssm_state_size(c.linear_key_head_dim)
    w.add_ssm_group_count(c.linear_num_key_heads)
    w.add_ssm_time_step_rank(c.linear_num_value_heads)
    w.add_ssm_inner_size(c.linear_value_head_dim * c.linear_num_value_heads)
    w.add_full_attention_interval(4)
    if arch != "qwen35":
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    add_bpe_tokenizer(w, "qwen2", bos=0, eos=2, specials=SPECIALS + MARKERS)  # eos: <|im_end|>
    w.add_chat_template(QWEN35_TEMPLATE)
    for name, tensor in model.state_dict().items():
        for gguf_name, data in _converted(name, tensor.float(), c, arch):
            small = data.dim() < 2 or "norm" in gguf_name or "ssm_conv" in gguf_name
            store(w, gguf_name, data.contiguous(), Q.F32 if small else qtype)
    finish(w)
    return path


def _converted(name: str, t: torch.Tensor, c, arch: str):
    """(GGUF name, tensor) for one HF tensor, as the converter's modify_tensors gives them."""
    if name == "model.embed_tokens.weight":
        return [("token_embd.weight", t)]
    if name == "lm_head.weight":
        return [("output.weight", t)]
    if name == "model.norm.weight":
        return [("output_norm.weight", t + 1)]
    _, _, i, suffix = name.split(".", 3)
    blk = f"blk.{i}."
    if suffix.endswith("norm.weight") and suffix != "linear_attn.norm.weight":
        t = t + 1
    if suffix == "linear_attn.A_log":
        t = -torch.exp(t)
    if suffix == "linear_attn.conv1d.weight":
        t = t.squeeze(1)
    if suffix == "mlp.shared_expert_gate.weight":
        t = t.reshape(-1)
    if suffix == "mlp.experts.gate_up_proj":
        gate, up = t.chunk(2, dim=1)
        return [(blk + "ffn_gate_exps.weight", gate), (blk + "ffn_up_exps.weight", up)]
    if suffix == "mlp.experts.down_proj":
        return [(blk + "ffn_down_exps.weight", t)]
    if suffix == "linear_attn.in_proj_qkvz.weight":
        return _split_qkvz(blk, t, c)
    if arch != "qwen3next" and suffix.startswith("linear_attn."):
        t = _tile_value_heads(suffix, t, c)
    return [(blk + LAYER[suffix], t)]


def _split_qkvz(blk: str, t: torch.Tensor, c) -> list[tuple[str, torch.Tensor]]:
    ratio = c.linear_num_value_heads // c.linear_num_key_heads
    kd, vd = c.linear_key_head_dim, c.linear_value_head_dim
    parts = [kd, kd, ratio * vd, ratio * vd]
    q, k, v, z = t.reshape(c.linear_num_key_heads, sum(parts), -1).split(parts, dim=1)
    flat = [x.reshape(-1, t.shape[-1]) for x in (q, k, v, z)]
    return [(blk + "attn_qkv.weight", torch.cat(flat[:3])), (blk + "attn_gate.weight", flat[3])]


def _tile_value_heads(suffix: str, t: torch.Tensor, c) -> torch.Tensor:
    """Value heads from grouped by key head (h * ratio + r) to tiled (r * k_heads + h)."""
    nk, nv = c.linear_num_key_heads, c.linear_num_value_heads
    ratio, vd = nv // nk, c.linear_value_head_dim

    def tiled(x: torch.Tensor, head: int) -> torch.Tensor:
        rest = x.shape[1:]
        return x.reshape(nk, ratio, head, *rest).transpose(0, 1).reshape(-1, *rest)

    keys = 2 * nk * c.linear_key_head_dim
    if suffix in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
        return torch.cat([t[:keys], tiled(t[keys:], vd)])
    if suffix == "linear_attn.in_proj_z.weight":
        return tiled(t, vd)
    if suffix in ("linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"):
        return tiled(t, 1)
    if suffix in ("linear_attn.dt_bias", "linear_attn.A_log"):
        return tiled(t, 1)
    if suffix == "linear_attn.out_proj.weight":
        return tiled(t.t(), vd).t()
    return t
