"""The tiny gpt-oss the tests write: transformers' GptOssForCausalLM with seeded random weights
(4 experts, top 2, a 4-token window, YaRN over an 8-token original context), and its GGUF as
llama.cpp's converter writes gpt-oss (experts F32 or MXFP4)."""

from __future__ import annotations

from collections.abc import Callable

import gguf
import torch
from hf_reference import Q, build_hf, write_gguf

EXPERTS, TOP_K, WINDOW, ORIGINAL, FACTOR = 4, 2, 4, 8, 32.0  # 8 * 32: the 256 positions
ROPE = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": FACTOR,
    "original_max_position_embeddings": ORIGINAL,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
}
EXPERT_WEIGHTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def gguf_round(weight: torch.Tensor, qtype: Q) -> torch.Tensor:
    """A linear weight [out, in] or an HF expert tensor [E, in, out] rounded to `qtype` by
    ggml's quantizer (blocks along `in`, as the GGUF file stores them), so that a file in that
    format holds exactly the reference's weights."""
    stacked = weight.dim() == 3
    rows = (weight.transpose(1, 2) if stacked else weight).contiguous().numpy()
    values = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(rows, qtype), qtype))
    return values.transpose(1, 2) if stacked else values


def gpt_oss_model(truncate: bool = False, rounded: Q | None = None, **overrides: object):
    """The tiny gpt-oss; truncate: YaRN's rounded ramp (llama.cpp's, so the GGUF reference);
    rounded: the experts (MXFP4), or every linear weight but the router (Q8_0), rounded to the
    format the file will hold."""
    settings = {
        "num_local_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "sliding_window": WINDOW,
        "rope_parameters": {**ROPE, "truncate": truncate},
        "tie_word_embeddings": False,
    }
    model = build_hf("gpt_oss", **{**settings, **overrides})
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 3:  # build_hf draws these N(0, 1): scale by fan-in as linears
                param /= param.shape[1] ** 0.5
            linear = param.dim() == 2 and "router" not in name
            if rounded is not None and (
                name.endswith(EXPERT_WEIGHTS) or rounded != Q.MXFP4 and linear
            ):
                param.copy_(gguf_round(param, rounded))
    return model


def _convert(suffix: str, t: torch.Tensor, qtype: Q):
    """gpt-oss's layer tensors as llama.cpp's converter writes them (conversion/gpt_oss.py):
    experts stacked per projection with gate and up de-interleaved, sinks and biases F32; the
    experts in `qtype` (MXFP4 or F32), the rest F32 (the linear ones: write_gguf's format)."""
    if suffix == "mlp.experts.gate_up_proj":
        rows = t.transpose(1, 2)
        return [
            ("ffn_gate_exps.weight", rows[:, 0::2], qtype),
            ("ffn_up_exps.weight", rows[:, 1::2], qtype),
        ]
    if suffix == "mlp.experts.down_proj":
        return [("ffn_down_exps.weight", t.transpose(1, 2), qtype)]
    if suffix == "mlp.experts.gate_up_proj_bias":
        return [("ffn_gate_exps.bias", t[:, 0::2], Q.F32), ("ffn_up_exps.bias", t[:, 1::2], Q.F32)]
    names = {
        "mlp.experts.down_proj_bias": "ffn_down_exps.bias",
        "mlp.router.weight": "ffn_gate_inp.weight",
        "mlp.router.bias": "ffn_gate_inp.bias",
        "self_attn.sinks": "attn_sinks.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.o_proj.bias": "attn_output.bias",
        "post_attention_layernorm.weight": "post_attention_norm.weight",
    }
    return [(names[suffix], t, Q.F32)] if suffix in names else None


def _metadata(config) -> Callable[[gguf.GGUFWriter], None]:
    """The gpt-oss keys of a model of `config` (its experts, width and window)."""

    def add(w: gguf.GGUFWriter) -> None:
        w.add_expert_count(config.num_local_experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_feed_forward_length(config.intermediate_size)
        w.add_sliding_window(config.sliding_window)
        _yarn(w)

    return add


def _yarn(w: gguf.GGUFWriter) -> None:
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(FACTOR)
    w.add_rope_scaling_orig_ctx_len(ORIGINAL)
    w.add_rope_scaling_yarn_beta_fast(32.0)
    w.add_rope_scaling_yarn_beta_slow(1.0)


def gpt_oss_gguf(model, path, experts: Q = Q.F32, qtype: Q = Q.F32, tokenizer=None):
    def convert(suffix, t, _):
        return _convert(suffix, t, experts)

    return write_gguf(
        model,
        path,
        "gpt-oss",
        qtype,
        metadata=_metadata(model.config),
        convert=convert,
        tokenizer=tokenizer,
    )
