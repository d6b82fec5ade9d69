"""Tensor parallel over gloo on the CPU: same tokens as one process, a clear error for a model
that does not split, a hand-launched torchrun-style pair serving HTTP, and a worker's death."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from model_fixtures import random_weights, real_model_path, save_hf_folder, tiny_config
from tokenizers import pre_tokenizers

import met
from met.parallel.shard import ShardError, check_divisible
from met.sampling import SamplingParams

PROMPTS = [[1, 5, 9, 33, 70, 100, 7], [1, 200, 3] * 7]


def _byte_tokenizer_json() -> str:
    """A byte-level tokenizer with exactly 256 ids, so every id the random model picks decodes."""
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "merges": []}
    model["vocab"] = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    return json.dumps(
        {
            "version": "1.0",
            "added_tokens": [],
            "normalizer": None,
            "pre_tokenizer": level,
            "post_processor": None,
            "decoder": level,
            "model": model,
        }
    )


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 layers, 4 heads, 2 KV heads, MLP 128, vocab 256: splits over 2 ranks."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    config = tiny_config(vocab=256)
    save_hf_folder(folder, config, random_weights(config, seed=7))
    (folder / "tokenizer.json").write_text(_byte_tokenizer_json())
    return folder


def _greedy_tokens(model: Path, tp: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    # Short prefill chunks so that chunked prefill, mixed steps and batched decode all run.
    with met.LLM(str(model), dtype="float32", tensor_parallel_size=tp, max_prefill_tokens=8) as llm:
        outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    return [out.token_ids for out in outputs]


def test_two_ranks_give_the_single_process_tokens(tiny_model: Path) -> None:
    assert _greedy_tokens(tiny_model, 2) == _greedy_tokens(tiny_model, 1)


def test_default_model_split_rules() -> None:
    from met.model.config import ModelConfig

    smollm2 = ModelConfig("llama", 30, 9, 3, 576, 64, 1536, 49152, 1e5, 8192, 1e-5)
    with pytest.raises(ShardError, match="cannot split 9 attention heads / 3 KV heads over 2"):
        check_divisible(smollm2, 2)
    check_divisible(smollm2, 3)  # the split the message offers


@pytest.mark.slow
def test_default_model_over_two_ranks_fails_before_spawning() -> None:
    path = real_model_path()
    if path is None:
        pytest.skip("the default model is not downloaded")
    with pytest.raises(ShardError, match=r"9 attention heads / 3 KV heads over 2 ranks.*1, 3"):
        met.LLM(str(path), tensor_parallel_size=2)
