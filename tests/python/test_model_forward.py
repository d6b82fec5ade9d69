"""The paged, packed LlamaModel against the independent dense reference on a tiny random model.

Tolerance: fp32 logits agree to max abs diff < 1e-4 (values are O(1..10)); bf16 to < 0.25.
"""

from __future__ import annotations

import random

import pytest
import torch
from model_fixtures import PagedRunner, random_weights, save_hf_folder, tiny_config

from met.hf_loader import load_hf
from met.model.llama import LlamaModel
from met.model.reference import reference_logits

torch.set_num_threads(2)
ATOL = 1e-4


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 128) for _ in range(n)]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tmp_path_factory):
    """A random model saved as a Hugging Face folder and read back through the HF loader."""
    config = tiny_config(architecture=request.param, attention_bias=request.param == "qwen2")
    folder = tmp_path_factory.mktemp(request.param)
    save_hf_folder(folder, config, random_weights(config))
    return load_hf(folder)


def _check(logits: torch.Tensor, config, weights, history: list[int]) -> None:
    """Each row of `logits` is the last len(logits) positions of `history`."""
    expect = reference_logits(config, weights, history)[-logits.shape[0] :]
    assert (logits - expect).abs().max().item() < ATOL


def test_hf_loader_roundtrip(tmp_path):
    config = tiny_config(tie_embeddings=True)
    weights = random_weights(config)
    save_hf_folder(tmp_path, config, weights)
    loaded_config, loaded = load_hf(tmp_path)
    assert loaded_config.tie_embeddings and "lm_head" not in loaded
    assert loaded_config.n_kv_heads == 2 and loaded_config.head_dim == 16
    assert loaded.keys() == weights.keys()
    assert all(torch.equal(loaded[n], weights[n]) for n in weights)


def test_prefill_matches_reference(tiny):
    config, weights = tiny
    runner = PagedRunner(LlamaModel(config, dict(weights)))
    prompt = _prompt(23, seed=1)
    (logits,) = runner.step([("a", prompt)])
    _check(logits, config, weights, prompt)


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 16])
def test_chunked_prefill_then_decode(tiny, chunk):
    config, weights = tiny
    runner = PagedRunner(LlamaModel(config, dict(weights)), seed=chunk)
    history = _prompt(30, seed=2)
    outputs = [runner.step([("a", history[s : s + chunk])])[0] for s in range(0, 30, chunk)]
    for _ in range(4):
        history.append(int(outputs[-1][-1].argmax()))
        outputs += runner.step([("a", history[-1:])])
    # The model is causal, so one reference pass over the whole history checks every step.
    _check(torch.cat(outputs), config, weights, history)


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1), (1, 2, 0)])
def test_mixed_batches(tiny, order):
    """Decode rows, a continuing prefill chunk and a first chunk share each forward."""
    config, weights = tiny
    runner = PagedRunner(LlamaModel(config, dict(weights)), num_blocks=96, seed=sum(order))
    seqs = {name: _prompt(n, seed=10 + i) for i, (name, n) in enumerate([("a", 9), ("b", 19)])}
    seqs["c"] = _prompt(14, seed=12)
    seqs["d"] = _prompt(5, seed=13)
    runner.step([("a", seqs["a"])])
    runner.step([("d", seqs["d"])])
    done = {"a": len(seqs["a"]), "b": 0, "c": 0, "d": len(seqs["d"])}
    plans = [
        [("a", 1), ("b", 8), ("d", 1)],  # two decodes around a first chunk
        [("b", 6), ("c", 5), ("a", 1)],  # continuing chunk, first chunk, decode
        [("c", 9), ("b", 5), ("d", 1), ("a", 1)],
    ]
    for plan in plans:
        rows = [plan[i] for i in order if i < len(plan)] + plan[len(order) :]
        batch = []
        for name, n in rows:
            if done[name] >= len(seqs[name]):  # decoding: extend with a fresh token
                seqs[name].append(random.Random(done[name]).randrange(3, 128))
            batch.append((name, seqs[name][done[name] : done[name] + n]))
            done[name] += n
        for (name, _), logits in zip(rows, runner.step(batch), strict=True):
            _check(logits, config, weights, seqs[name][: done[name]])


def test_logits_rows_select_positions(tiny):
    config, weights = tiny
    model = LlamaModel(config, dict(weights))
    cache = model.allocate_kv_cache(8, 4)
    prompt = _prompt(10, seed=5)
    table = [7, 2, 5]
    slots = [table[p // 4] * 4 + p % 4 for p in range(10)]
    logits = model.forward(cache, prompt, list(range(10)), slots, [table], [10], [0, 10], [9, 3])
    expect = reference_logits(config, weights, prompt)
    assert logits.shape == (2, config.vocab) and logits.dtype == torch.float32
    assert (logits - expect[[9, 3]]).abs().max().item() < ATOL


def test_bf16_forward_close(tiny):
    config, weights = tiny
    runner = PagedRunner(LlamaModel(config, dict(weights), dtype=torch.bfloat16))
    prompt = _prompt(12, seed=6)
    (logits,) = runner.step([("a", prompt[:8])])
    (logits,) = runner.step([("a", prompt[8:])])
    assert runner.cache.k.dtype == torch.bfloat16 and logits.dtype == torch.float32
    expect = reference_logits(config, weights, prompt)[8:]
    assert (logits - expect).abs().max().item() < 0.25
