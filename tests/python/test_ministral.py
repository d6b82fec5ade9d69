"""Ministral 8B (met.model.families.ministral): Mistral's layers, sliding and full attention as
config.json's layer_types interleaves them. transformers' MinistralForCausalLM on a tiny seeded
model with an 8-token window (the test prompts run to 20 positions) is the reference."""

from __future__ import annotations

import json

import pytest
from hf_reference import assert_matches_transformers, build_hf, hf_logits, save_hf

from met.hf_loader import read_hf_config
from met.model.config import ModelLoadError

KINDS = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def _model():
    return build_hf("ministral", sliding_window=8, layer_types=KINDS)


def test_ministral_matches_transformers_past_the_window(tmp_path):
    model = _model()
    folder = save_hf(model, tmp_path / "ministral")
    config = read_hf_config(folder)
    assert config.family == "ministral"
    assert [s.window for s in config.layer_specs()] == [8, None, 8, None]
    assert assert_matches_transformers(folder, hf_logits(model), 1e-5) == ["torch"]


def test_a_layer_types_list_of_the_wrong_length_is_refused(tmp_path):
    folder = save_hf(_model(), tmp_path / "ministral")
    raw = json.loads((folder / "config.json").read_text())
    raw["layer_types"] = KINDS[:2]
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match="layer_types names 2 layers, the model has 4"):
        read_hf_config(folder)
