"""Mixtral: Mistral's attention, every layer's MLP num_local_experts experts, top-k always
renormalised. Its GGUF files are `llama` ones with expert_count (family llama)."""

from typing import Any

from met.model.config import ModelConfig
from met.model.families.spec import Family


def _hf_config(config: ModelConfig, raw: dict[str, Any]) -> None:
    config.n_experts = int(raw["num_local_experts"])
    config.n_experts_used = int(raw.get("num_experts_per_tok", 2))


FAMILY = Family(name="mixtral", hf_types=("mixtral",), hf_config=_hf_config)
