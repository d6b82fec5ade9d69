"""Ministral 3 / Mistral Small 3 (met.model.families.mistral3): Mistral's layers with YaRN RoPE
and a Llama 4-style query temperature. transformers' Ministral3ForCausalLM on a tiny seeded model
(an original context of 8 tokens, so the tests' positions pass it and the temperature steps) is
the reference for the HF folder (also wrapped as the multimodal `mistral3`) and for GGUF files of
the same weights (F32; Q8_0 against its own dequantized weights), on every forward that claims the
family; greedy tokens batch-invariant; `met serve` chats."""

from __future__ import annotations

import json
import math

import gguf
import pytest
import torch
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
from safetensors.torch import load_file, save_file

from met.gguf_loader import open_gguf, read_config
from met.hf_loader import read_hf_config
from met.model.capability import QUERY_TEMPERATURE, missing

ORIGINAL, FACTOR, BETA = 8, 32.0, 0.1  # 8 * 32: the tiny models' 256 positions
# mscale == mscale_all_dim: YaRN's cos/sin magnitude is 1 in transformers, as in llama.cpp.
ROPE = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": FACTOR,
    "original_max_position_embeddings": ORIGINAL,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": BETA,
}
# Q8_0 over four layers against float activations: measured 1.6% of the largest logit.
TOL = {"hf": 1e-5, "f32": 1e-5, "q8_0": 2e-2}


def _model(**rope: object):
    return build_hf("ministral3", tie_word_embeddings=False, rope_parameters={**ROPE, **rope})


def _metadata(w: gguf.GGUFWriter) -> None:
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(FACTOR)
    w.add_rope_scaling_orig_ctx_len(ORIGINAL)
    w.add_rope_scaling_yarn_beta_fast(32.0)
    w.add_rope_scaling_yarn_beta_slow(1.0)
    w.add_attn_temperature_scale(BETA)


def _gguf(model, path, qtype=Q.Q8_0):
    return write_gguf(model, path, "mistral3", qtype, permuted=True, metadata=_metadata)


@pytest.mark.parametrize("kind", ["hf", "f32", "q8_0"])
def test_ministral3_matches_transformers_on_every_forward(tmp_path, kind):
    model = _model()
    path, reference = file_and_reference(
        model, kind, tmp_path / "ministral3", lambda q: _gguf(model, tmp_path / "m.gguf", q)
    )
    names = assert_matches_transformers(path, hf_logits(reference), TOL[kind])
    assert names == (["torch", "cpp"] if kind == "q8_0" else ["torch"])


def test_yarn_magnitude_from_mscale_as_transformers_derives_it(tmp_path):
    # Without mscale/mscale_all_dim transformers scales cos/sin by 0.1 ln(factor) + 1.
    model = _model(mscale=None, mscale_all_dim=None)
    path = save_hf(model, tmp_path / "ministral3")
    config = read_hf_config(path)
    assert config.rope_attn_factor == pytest.approx(0.1 * math.log(FACTOR) + 1.0)
    assert assert_matches_transformers(path, hf_logits(model), TOL["hf"]) == ["torch"]


def test_the_multimodal_mistral3_folder_serves_its_text_model(tmp_path):
    model = _model()
    folder = save_hf(model, tmp_path / "mistral3")
    raw = json.loads((folder / "config.json").read_text())
    wrapped = {"model_type": "mistral3", "text_config": raw, "vision_config": {"hidden_size": 8}}
    (folder / "config.json").write_text(json.dumps(wrapped))
    tensors = load_file(str(folder / "model.safetensors"))
    renamed = {
        name
        if name.startswith("lm_head")
        else "model.language_model." + name.removeprefix("model."): t
        for name, t in tensors.items()
    }
    renamed["model.vision_tower.patch_conv.weight"] = torch.zeros(8, 3, 2, 2)
    save_file(renamed, str(folder / "model.safetensors"))
    assert read_hf_config(folder).family == "mistral3"
    assert assert_matches_transformers(folder, hf_logits(model), TOL["hf"]) == ["torch"]


def test_ministral3_config_from_both_formats(tmp_path):
    path = _gguf(_model(), tmp_path / "m.gguf")
    config = read_config(open_gguf(path), path)
    folder_config = read_hf_config(save_hf(_model(), tmp_path / "hf"))
    for c in (config, folder_config):
        assert c.family == "mistral3" and c.rope_scaling.kind == "yarn"
        assert (c.attn_temp_scale, c.attn_temp_length, c.rope_attn_factor) == (
            pytest.approx(BETA),
            ORIGINAL,
            1.0,
        )
        assert c.attn_temperature(ORIGINAL - 1) == 1.0
        assert c.attn_temperature(2 * ORIGINAL) == pytest.approx(1 + BETA * math.log(3))
        assert missing(c, "cuda") == [QUERY_TEMPERATURE] and missing(c, "cpu") == []
    assert config.inv_freq() == pytest.approx(folder_config.inv_freq())


def test_ministral3_greedy_is_batch_invariant(tmp_path):
    assert_greedy_batch_invariant(_gguf(_model(), tmp_path / "m.gguf"))


@pytest.mark.slow
def test_met_serve_chats_with_ministral3(tmp_path):
    assert_serves_chat(_gguf(_model(), tmp_path / "m.gguf"), "ministral3")
