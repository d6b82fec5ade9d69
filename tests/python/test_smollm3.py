"""SmolLM3 (met.model.families.smollm3): Llama's layers with no RoPE on every 4th layer.
transformers' SmolLM3ForCausalLM on a tiny seeded model is the reference for the HF folder and
for GGUF files of the same weights (F32; Q8_0 against its own dequantized weights), on every
forward that claims the family; greedy tokens batch-invariant; `met serve` chats."""

from __future__ import annotations

import json

import pytest
from hf_reference import (
    Q,
    assert_greedy_batch_invariant,
    assert_matches_transformers,
    assert_serves_chat,
    build_hf,
    file_and_reference,
    hf_logits,
    save_hf,
    write_gguf,
)

from met.gguf_loader import open_gguf, read_config
from met.hf_loader import read_hf_config
from met.model.capability import NO_ROPE, missing
from met.model.config import ModelLoadError

# Float32 weights: met and transformers differ in summation order only. Q8_0: met's int8
# activations against float ones over four layers (test_families' models have two): measured
# 1.6% of the largest logit.
TOL = {"hf": 1e-5, "f32": 1e-5, "q8_0": 2e-2}


def _model(**overrides):
    return build_hf("smollm3", tie_word_embeddings=True, **overrides)


def _gguf(tmp_path, qtype=Q.Q8_0):
    return write_gguf(_model(), tmp_path / "smollm3.gguf", "smollm3", qtype, permuted=True)


@pytest.mark.parametrize("kind", ["hf", "f32", "q8_0"])
def test_smollm3_matches_transformers_on_every_forward(tmp_path, kind):
    model = _model()
    path, reference = file_and_reference(
        model,
        kind,
        tmp_path / "smollm3",
        lambda q: write_gguf(model, tmp_path / "s.gguf", "smollm3", q, permuted=True),
    )
    names = assert_matches_transformers(path, hf_logits(reference), TOL[kind])
    assert names == (["torch", "cpp"] if kind == "q8_0" else ["torch"])


def test_every_4th_layer_has_no_rope_in_both_formats(tmp_path):
    # GGUF has no key for it: llama.cpp's rule, (layer + 1) % 4 == 0 goes without.
    path = _gguf(tmp_path)
    config = read_config(open_gguf(path), path)
    assert [s.rope for s in config.layer_specs()] == ["global", "global", "global", "none"]
    assert missing(config, "cuda") == [NO_ROPE] and missing(config, "cpu") == []
    # A config.json's own no_rope_layers win over the interval.
    folder = save_hf(_model(), tmp_path / "hf")
    raw = json.loads((folder / "config.json").read_text())
    raw["no_rope_layers"] = [0, 1, 1, 1]
    (folder / "config.json").write_text(json.dumps(raw))
    assert [s.rope for s in read_hf_config(folder).layer_specs()][0] == "none"
    raw["no_rope_layers"] = [1, 1]
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match="no_rope_layers names 2 layers, the model has 4"):
        read_hf_config(folder)


def test_smollm3_greedy_is_batch_invariant(tmp_path):
    assert_greedy_batch_invariant(_gguf(tmp_path))


@pytest.mark.slow
def test_met_serve_chats_with_smollm3(tmp_path):
    assert_serves_chat(_gguf(tmp_path), "smollm3")
