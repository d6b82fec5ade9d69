"""Ministral 8B (`ministral` in HF): Mistral's layers, each sliding or full as the config's
layer_types says (every layer slides when it names none and a window is set, as transformers
reads it). llama.cpp converts it as a `llama` GGUF, read by that family, without the pattern."""

from typing import Any

from met.model.config import ModelConfig, ModelLoadError
from met.model.families.spec import Family


def _hf_config(config: ModelConfig, raw: dict[str, Any]) -> None:
    kinds = raw.get("layer_types")
    if config.sliding_window is None or not kinds:
        return
    if len(kinds) != config.n_layers:
        raise ModelLoadError(
            f"layer_types names {len(kinds)} layers, the model has {config.n_layers}"
        )
    config.sliding_layers = [kind == "sliding_attention" for kind in kinds]


FAMILY = Family(name="ministral", hf_types=("ministral",), hf_config=_hf_config)
