"""Qwen2: Llama's layers with biases on the Q/K/V projections (which its HF config leaves
implicit); NEOX RoPE, so GGUF rows are not permuted."""

from typing import Any

from met.model.config import ModelConfig
from met.model.families.spec import Family


def _hf_config(config: ModelConfig, raw: dict[str, Any]) -> None:
    config.attention_bias = True


FAMILY = Family(name="qwen2", gguf_archs=("qwen2",), hf_types=("qwen2",), hf_config=_hf_config)
