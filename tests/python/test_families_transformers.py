"""The families met ran before the family modules, from their tests' tiny HF folders, against
transformers loading the same folder (float32, eager attention): logits within 1e-5 of the largest,
argmax equal up to near-ties. Phi-3 is left out: transformers picks LongRoPE's short or long
factors by the sequence's own length, llama.cpp and met by the context the model serves."""

from __future__ import annotations

import pytest
import torch
from family_fixtures import write_family_hf
from gemma_fixtures import write_gemma_hf
from hf_reference import assert_matches_transformers, hf_logits
from model_fixtures import byte_tokenizer_json, random_weights, save_hf_folder, tiny_config

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "qwen3moe", "mixtral", "gemma2", "gemma3"]


def _folder(tmp_path, family: str):
    folder = tmp_path / family
    if family in ("gemma2", "gemma3"):
        write_gemma_hf(folder, family)
    elif family in ("llama", "mistral"):
        config = tiny_config(architecture=family, vocab=256, tie_embeddings=False)
        folder.mkdir()
        save_hf_folder(folder, config, random_weights(config, seed=4))
        (folder / "tokenizer.json").write_text(byte_tokenizer_json())
    else:
        write_family_hf(folder, family)
    return folder


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_folder_matches_transformers(tmp_path, family):
    from transformers import AutoModelForCausalLM

    folder = _folder(tmp_path, family)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert assert_matches_transformers(folder, hf_logits(model), 1e-5) == ["torch"]
