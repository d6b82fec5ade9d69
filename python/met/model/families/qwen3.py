"""Qwen3: Qwen2 without the biases, with a per-head RMSNorm on Q and K before RoPE."""

from typing import Any

from met.model.config import ModelConfig
from met.model.families.spec import Family


def hf_qk_norm(config: ModelConfig, raw: dict[str, Any]) -> None:
    config.qk_norm = True


FAMILY = Family(name="qwen3", gguf_archs=("qwen3",), hf_types=("qwen3",), hf_config=hf_qk_norm)
