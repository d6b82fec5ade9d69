"""The model families met runs, one module each, and their lookup by the names files use."""

from __future__ import annotations

from met.model.config import ModelLoadError
from met.model.families import (
    gemma2,
    gemma3,
    gemma4,
    gpt_oss,
    llama,
    ministral,
    mistral,
    mistral3,
    mixtral,
    olmo2,
    phi3,
    qwen2,
    qwen3,
    qwen3moe,
    qwen3next,
    qwen35,
    qwen35moe,
    smollm3,
)
from met.model.families.spec import Family, LayerSpec

FAMILIES: dict[str, Family] = {
    module.FAMILY.name: module.FAMILY
    for module in (
        llama,
        mistral,
        mixtral,
        qwen2,
        qwen3,
        qwen3moe,
        phi3,
        gemma2,
        gemma3,
        gemma4,
        olmo2,
        smollm3,
        mistral3,
        ministral,
        gpt_oss,
        qwen35,
        qwen35moe,
        qwen3next,
    )
}
_BY_GGUF = {arch: f for f in FAMILIES.values() for arch in f.gguf_archs}
_BY_HF = {kind: f for f in FAMILIES.values() for kind in f.hf_types}
GGUF_ARCHS = sorted(_BY_GGUF)
HF_TYPES = sorted(_BY_HF)

__all__ = ["FAMILIES", "Family", "LayerSpec", "gguf_family", "hf_family"]


def gguf_family(arch: object, source: object) -> Family:
    """The family of a GGUF file's general.architecture; ModelLoadError naming the supported."""
    family = _BY_GGUF.get(arch) if isinstance(arch, str) else None
    if family is None:
        raise ModelLoadError(
            f"{source}: architecture {arch!r} is not supported (supported: {', '.join(GGUF_ARCHS)})"
        )
    return family


def hf_family(model_type: object, source: object) -> Family:
    """The family of a config.json's model_type; ModelLoadError naming the supported."""
    family = _BY_HF.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ModelLoadError(
            f"{source}: model_type {model_type!r} is not supported (supported: "
            f"{', '.join(HF_TYPES)})"
        )
    return family
