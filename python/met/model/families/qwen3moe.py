"""Qwen3-MoE: Qwen3's attention, every layer's MLP a softmax-routed mixture of experts of width
moe_intermediate_size, the top-k weights renormalised per norm_topk_prob."""

from typing import Any

from met.model.config import ModelConfig, ModelLoadError
from met.model.families.spec import Family


def _hf_config(config: ModelConfig, raw: dict[str, Any]) -> None:
    if raw.get("mlp_only_layers") or int(raw.get("decoder_sparse_step", 1)) != 1:
        raise ModelLoadError(
            "Qwen3-MoE with dense layers between the sparse ones (mlp_only_layers, "
            "decoder_sparse_step) is not supported"
        )
    config.qk_norm = True
    config.n_experts = int(raw["num_experts"])
    config.n_experts_used = int(raw["num_experts_per_tok"])
    config.moe_norm_topk = bool(raw.get("norm_topk_prob", False))


FAMILY = Family(
    name="qwen3moe", gguf_archs=("qwen3moe",), hf_types=("qwen3_moe",), hf_config=_hf_config
)
