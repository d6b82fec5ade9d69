"""OLMo 2: no pre-norms, each sublayer's output RMS-normalized before it joins the residual
(post_attention_layernorm, post_feedforward_layernorm), Q and K each normalized over the whole
projection before RoPE, an untied head. NEOX RoPE: GGUF rows are not permuted."""

from dataclasses import replace

from met.model.config import ModelConfig
from met.model.families.spec import Family, LayerSpec, standard_layers


def _layers(config: ModelConfig) -> list[LayerSpec]:
    return [replace(s, qk_norm="full", norms="post") for s in standard_layers(config)]


FAMILY = Family(
    name="olmo2",
    gguf_archs=("olmo2",),
    hf_types=("olmo2",),
    layers=_layers,
    hf_names={
        "post_attention_layernorm.weight": "post_attn_norm",
        "post_feedforward_layernorm.weight": "post_mlp_norm",
    },
)
