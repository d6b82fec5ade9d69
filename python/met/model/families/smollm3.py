"""SmolLM3: Llama's layers, with every 4th layer attending without RoPE (NoPE). A config.json
names those layers (no_rope_layers: 1 rotates, 0 does not; else every no_rope_layer_interval-th);
a GGUF file has no key for them, and llama.cpp takes every 4th, as here."""

from dataclasses import replace
from typing import Any

from met.model.config import ModelConfig, ModelLoadError
from met.model.families.spec import Family, GgufGet, standard_layers

_INTERVAL = 4  # llama.cpp's n_no_rope_layer_step for smollm3


def _plan(config: ModelConfig, rotating: list[bool]) -> None:
    if len(rotating) != config.n_layers:
        raise ModelLoadError(
            f"no_rope_layers names {len(rotating)} layers, the model has {config.n_layers}"
        )
    specs = standard_layers(config)
    config.layers = [
        s if r else replace(s, rope="none") for s, r in zip(specs, rotating, strict=True)
    ]


def _every(config: ModelConfig, interval: int) -> list[bool]:
    return [(i + 1) % interval != 0 for i in range(config.n_layers)]


def _hf_config(config: ModelConfig, raw: dict[str, Any]) -> None:
    flags = raw.get("no_rope_layers")
    if flags is None:
        flags = _every(config, int(raw.get("no_rope_layer_interval", _INTERVAL)))
    _plan(config, [bool(f) for f in flags])


def _gguf_config(config: ModelConfig, get: GgufGet) -> None:
    _plan(config, _every(config, _INTERVAL))


FAMILY = Family(
    name="smollm3",
    gguf_archs=("smollm3",),
    hf_types=("smollm3",),
    gguf_permuted=True,
    gguf_config=_gguf_config,
    hf_config=_hf_config,
)
