"""OLMo 2 (met.model.families.olmo2): post-norms only, Q/K norms over the whole projection, an
untied head. transformers' Olmo2ForCausalLM on a tiny seeded model is the reference for the HF
folder and for GGUF files of the same weights (F32; Q8_0 against its own dequantized weights),
on every forward that claims the family; greedy tokens batch-invariant; `met serve` chats."""

from __future__ import annotations

import pytest
from hf_reference import (
    assert_greedy_batch_invariant,
    assert_matches_transformers,
    assert_serves_chat,
    build_hf,
    file_and_reference,
    hf_logits,
    write_gguf,
)

from met.gguf_loader import open_gguf, read_config
from met.model.capability import FULL_QK_NORM, NO_PRE_NORMS, POST_NORMS, missing

# Float32 weights: met and transformers differ in summation order only. Q8_0: met's int8
# activations against float ones; without pre-norms the matmuls read the raw residual stream,
# wider per block than a normalized one, so they move logits more than test_families' 1.5%
# (measured 2.3% of the largest logit).
TOL = {"hf": 1e-5, "f32": 1e-5, "q8_0": 3e-2}
GGUF_NAMES = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
HF_NAMES = {
    "post_attn_norm": "post_attention_layernorm.weight",
    "post_mlp_norm": "post_feedforward_layernorm.weight",
}


def _model():
    return build_hf("olmo2", tie_word_embeddings=False)


@pytest.mark.parametrize("kind", ["hf", "f32", "q8_0"])
def test_olmo2_matches_transformers_on_every_forward(tmp_path, kind):
    model = _model()
    path, reference = file_and_reference(
        model,
        kind,
        tmp_path / "olmo2",
        lambda q: write_gguf(model, tmp_path / "olmo2.gguf", "olmo2", q, names=GGUF_NAMES),
        HF_NAMES,
    )
    names = assert_matches_transformers(path, hf_logits(reference), TOL[kind])
    assert names == (["torch", "cpp"] if kind == "q8_0" else ["torch"])


def test_olmo2_plan_and_capability(tmp_path):
    path = write_gguf(_model(), tmp_path / "olmo2.gguf", "olmo2", names=GGUF_NAMES)
    config = read_config(open_gguf(path), path)
    assert config.family == "olmo2" and not config.tie_embeddings
    assert {(s.norms, s.qk_norm, s.rope) for s in config.layer_specs()} == {
        ("post", "full", "global")
    }
    assert missing(config, "cpu") == [] and missing(config, "torch") == []
    assert missing(config, "cuda") == [FULL_QK_NORM, POST_NORMS, NO_PRE_NORMS]


def test_olmo2_greedy_is_batch_invariant(tmp_path):
    assert_greedy_batch_invariant(
        write_gguf(_model(), tmp_path / "o.gguf", "olmo2", names=GGUF_NAMES)
    )


@pytest.mark.slow
def test_met_serve_chats_with_olmo2(tmp_path):
    assert_serves_chat(
        write_gguf(_model(), tmp_path / "o.gguf", "olmo2", names=GGUF_NAMES), "olmo2"
    )
