"""The default model end to end (slow): paged forward against the dense reference, greedy answer.

Tolerance: fp32 logits (magnitudes up to ~40) agree with the reference to max abs diff < 2e-3.
"""

from __future__ import annotations

import pytest
import torch
from model_fixtures import PagedRunner, real_model_path

from met.gguf_loader import load_gguf, open_gguf
from met.model.llama import LlamaModel
from met.model.reference import reference_logits
from met.tokenizer import Tokenizer

pytestmark = pytest.mark.slow
torch.set_num_threads(2)
ATOL = 2e-3
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def loaded():
    path = real_model_path()
    if path is None:
        pytest.skip("default model not found (set MET_TEST_MODEL or run `met pull`)")
    reader = open_gguf(path)
    config, weights = load_gguf(path, torch.float32, reader)
    return config, weights, LlamaModel(config, dict(weights)), Tokenizer.from_gguf(path, reader)


def test_config(loaded):
    config = loaded[0]
    assert (config.n_layers, config.hidden, config.n_heads, config.n_kv_heads) == (30, 576, 9, 3)
    assert (config.ffn, config.vocab, config.rope_theta) == (1536, 49152, 100000.0)
    assert config.tie_embeddings and config.eos_token_ids == [2]


def test_paged_matches_reference(loaded):
    config, weights, model, tokenizer = loaded
    prompt = tokenizer.encode_chat(QUESTION)
    other = tokenizer.encode("The quick brown fox jumps over the lazy dog, and then")
    runner = PagedRunner(model, num_blocks=32, block_size=16, seed=4)
    (head,) = runner.step([("q", prompt[:20])])
    # A continuing chunk of one sequence beside the first chunk of another, then a decode.
    chunk, first = runner.step([("q", prompt[20:]), ("o", other[:7])])
    step = prompt + [int(chunk[-1].argmax())]
    decode, rest = runner.step([("q", step[-1:]), ("o", other[7:])])
    # Causal model: one reference pass per sequence checks all of its steps.
    expect_q = reference_logits(config, weights, step)
    expect_o = reference_logits(config, weights, other)
    assert (torch.cat([head, chunk, decode]) - expect_q).abs().max() < ATOL
    assert (torch.cat([first, rest]) - expect_o).abs().max() < ATOL


def test_greedy_answer_mentions_paris(loaded):
    _, _, model, tokenizer = loaded
    runner = PagedRunner(model, num_blocks=16, block_size=16)
    (logits,) = runner.step([("q", tokenizer.encode_chat(QUESTION))])
    answer = []
    for _ in range(12):
        answer.append(int(logits[-1].argmax()))
        if answer[-1] in tokenizer.eos_token_ids:
            break
        (logits,) = runner.step([("q", answer[-1:])])
    assert "Paris" in tokenizer.decode(answer)
