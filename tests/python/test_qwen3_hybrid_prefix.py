"""Prefix caching of a hybrid model through the engine (met.engine.hybrid): a repeated prompt, the
next turn of a chat and another prompt with the same opening resume from recurrent-state
checkpoints at block boundaries, report the tokens they reused as cached_tokens and give the
tokens an engine without a prefix cache gives, on the torch forward (a float32 file) and on the
C++ one (Q8_0 blocks)."""

from __future__ import annotations

import pytest
from gguf_writing import Q
from hybrid_fixtures import build, write_gguf

import met
from met.engine import hybrid

GREEDY = met.SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPT = [(5 * i) % 90 + 10 for i in range(40)]  # longer than two prefill chunks
OPTIONS = {"device": "cpu", "max_num_seqs": 4, "max_prefill_tokens": 16}


@pytest.fixture(scope="module", params=["F32", "Q8_0"])
def hybrid_file(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("hybrid") / f"{request.param}.gguf"
    return str(write_gguf(build("qwen35moe"), path, "qwen35moe", getattr(Q, request.param)))


def _run(llm: met.LLM, prompt: list[int]) -> tuple[list[int], int]:
    (out,) = llm.generate(prompt_token_ids=[prompt], sampling_params=GREEDY)
    return out.token_ids, out.usage.get("cached_tokens", 0)


def _uncached(path: str, prompts: list[list[int]]) -> list[list[int]]:
    with met.LLM(model=path, **dict(OPTIONS, enable_prefix_cache=False)) as llm:
        return [_run(llm, p)[0] for p in prompts]


def test_a_repeated_prompt_and_the_next_turn_resume_from_the_last_full_block(hybrid_file):
    with met.LLM(model=hybrid_file, **OPTIONS) as llm:
        first, cached = _run(llm, PROMPT)
        assert cached == 0
        again, cached = _run(llm, PROMPT)
        assert cached == 32  # the prompt's last full block; its 8 last tokens run again
        turn = PROMPT + first + [7, 8, 9]
        reply, cached = _run(llm, turn)
        assert cached == 32  # the first prompt's checkpoint: the reply ran as decode
        assert _run(llm, turn) == (reply, 48)
        assert llm.engine.stats().prefix_cache_hit_tokens == 32 + 32 + 48
    assert [first, first, reply] == [again, *_uncached(hybrid_file, [PROMPT, turn])]


def test_a_shared_opening_resumes_from_a_checkpoint_inside_the_first_prompt(
    hybrid_file, monkeypatch
):
    monkeypatch.setattr(hybrid, "CHECKPOINT_INTERVAL", 64)
    opening = [(7 * i) % 90 + 3 for i in range(130)]
    prompts = [opening + [11] * 20, opening + [12] * 20]
    with met.LLM(model=hybrid_file, **OPTIONS) as llm:
        runs = [_run(llm, p) for p in prompts]
    assert [cached for _, cached in runs] == [0, 128]  # the checkpoint at 128 of the first
    assert [tokens for tokens, _ in runs] == _uncached(hybrid_file, prompts)


def test_the_least_recently_used_checkpoint_goes_first(hybrid_file):
    other = [(3 * i) % 90 + 4 for i in range(40)]
    with met.LLM(model=hybrid_file, **dict(OPTIONS, state_checkpoints=1)) as llm:
        first, _ = _run(llm, PROMPT)
        _run(llm, other)  # takes the one checkpoint
        assert _run(llm, PROMPT) == (first, 0)
        assert _run(llm, PROMPT) == (first, 32)
