"""Prompt logprobs through the engine: every prompt position's logprob, chunked or whole, cached
prefix or not, on the C++ forward (quantized GGUF) and the torch forward (dequantized)."""

from __future__ import annotations

import pytest
import torch
from test_gguf import write_tiny_gguf

from met.config import EngineConfig
from met.engine.core import EngineCore
from met.sampling import SamplingParams

PROMPT = [5, 17, 33, 9, 60, 61, 12, 40, 41, 7, 3, 22, 50, 8, 19, 30, 31, 44, 45, 10]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompt-lp") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def _engine(path, weight_format: str, chunk: int) -> EngineCore:
    config = EngineConfig(
        model=str(path),
        weight_format=weight_format,
        device="cpu",
        max_prefill_tokens=chunk,
        max_num_seqs=4,
        kv_cache_blocks=64,
        block_size=4,
    )
    return EngineCore(config)


def _run(engine: EngineCore, requests: dict[str, SamplingParams]) -> dict[str, list]:
    for name, params in requests.items():
        engine.add_request(name, PROMPT, params)
    deltas: dict[str, list] = {name: [] for name in requests}
    while engine.has_work():
        for delta in engine.step():
            deltas[delta.request_id].append(delta)
    return deltas


def _expected(engine: EngineCore) -> torch.Tensor:
    """log_softmax of every position's logits, from one whole-prompt forward of the engine's own
    model (the same forward the engine runs, outside the scheduler)."""
    model, n = engine.backend.model, len(PROMPT)
    engine.blocks.allocate_prefix(999, [])
    assert engine.blocks.grow(999, n)
    table = engine.blocks.table(999)
    bs = engine.blocks.block_size()
    logits = model.forward(
        engine.backend.kv_cache,
        torch.tensor(PROMPT),
        torch.arange(n),
        torch.tensor([table[p // bs] * bs + p % bs for p in range(n)]),
        torch.tensor([table], dtype=torch.int32),
        torch.tensor([n], dtype=torch.int32),
        torch.tensor([0, n], dtype=torch.int32),
        torch.arange(n),
    )
    engine.blocks.release(999)
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.parametrize("weight_format", ["gguf", "dequantized"])
def test_every_prompt_token_is_scored_chunked_or_whole(gguf_file, weight_format):
    greedy = {"temperature": 0.0, "max_tokens": 3}
    for chunk in (0, 6):
        engine = _engine(gguf_file, weight_format, chunk)
        expected = _expected(engine)
        runs = _run(
            engine,
            {
                "plain": SamplingParams(**greedy),
                "scored": SamplingParams(**greedy, prompt_logprobs=2),
                "only": SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=0),
            },
        )
        # The scored request's first delta carries them; nothing else does.
        assert all(d.prompt_logprobs is None for d in runs["plain"])
        entries = runs["scored"][0].prompt_logprobs
        assert entries[0] is None and len(entries) == len(PROMPT)
        for p in range(1, len(PROMPT)):
            lp = entries[p]
            assert lp.token_id == PROMPT[p]
            assert lp.logprob == pytest.approx(
                expected[p - 1, PROMPT[p]].item(), rel=1e-5, abs=1e-4
            )
            assert lp.rank == int((expected[p - 1] > expected[p - 1, PROMPT[p]]).sum()) + 1
            best = expected[p - 1].topk(2)
            assert [t for t, _ in lp.top] == best.indices.tolist()
        # Scoring changes nothing about what is generated.
        tokens = [t for d in runs["plain"] for t in d.token_ids]
        assert [t for d in runs["scored"] for t in d.token_ids] == tokens
        # max_tokens 0: the prompt's scores and no output at all.
        only = runs["only"]
        assert len(only) == 1 and only[0].token_ids == [] and only[0].text == ""
        assert only[0].finish_reason == "length" and only[0].completion_tokens == 0
        alone = [e.logprob for e in only[0].prompt_logprobs[1:]]
        assert alone == pytest.approx([e.logprob for e in entries[1:]], abs=1e-4)
        assert engine.blocks.num_used_blocks() == 0  # every request done: no block held


def test_a_cached_prefix_is_scored_anyway(gguf_file):
    engine = _engine(gguf_file, "gguf", 0)
    _run(engine, {"a": SamplingParams(temperature=0.0, max_tokens=2)})
    hits = engine.blocks.prefix_hit_tokens()
    scored = _run(engine, {"b": SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)})
    entries = scored["b"][0].prompt_logprobs
    assert all(e is not None for e in entries[1:])
    assert scored["b"][-1].cached_tokens == 0 and engine.blocks.prefix_hit_tokens() == hits
    # The cache still serves every other request.
    _run(engine, {"c": SamplingParams(temperature=0.0, max_tokens=2)})
    again = _run(engine, {"d": SamplingParams(temperature=0.0, max_tokens=2)})
    assert again["d"][-1].cached_tokens > 0
