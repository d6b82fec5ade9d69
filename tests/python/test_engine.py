"""The real default model behind the C++ scheduler: batching, prefix cache, sampling, stops."""

from __future__ import annotations

import pytest

import met
from met.sampling import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write one sentence about the ocean.",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def llm(default_model_path) -> met.LLM:
    return met.LLM(model=str(default_model_path), dtype="float32", max_prefill_tokens=32)


def _chat_ids(llm: met.LLM, text: str) -> list[int]:
    return llm.tokenizer.encode_chat([{"role": "user", "content": text}])


def test_pinned_greedy_answer(llm: met.LLM) -> None:
    out = llm.chat([{"role": "user", "content": PROMPTS[0]}], GREEDY)[0]
    # Pinned from an exact fp32 forward of the dequantized weights (the model reference agrees).
    assert out.text == "The capital of France is Paris."
    assert out.finish_reason in ("stop", "length")
    assert out.usage["completion_tokens"] == len(out.token_ids) + (out.finish_reason == "stop")


def test_batch_of_eight_matches_solo(llm: met.LLM) -> None:
    solo = [
        llm.generate(prompt_token_ids=_chat_ids(llm, p), sampling_params=GREEDY)[0] for p in PROMPTS
    ]
    fillers = [f"Count from {i} to {i + 5}." for i in range(5)]
    batch = llm.generate(
        prompt_token_ids=[_chat_ids(llm, p) for p in PROMPTS + fillers], sampling_params=GREEDY
    )
    for alone, together in zip(solo, batch, strict=False):
        assert alone.token_ids == together.token_ids


def test_prefix_cache_hit_gives_same_tokens(llm: met.LLM) -> None:
    long_system = "You are a careful assistant. " * 12
    messages = [
        {"role": "system", "content": long_system},
        {"role": "user", "content": PROMPTS[1]},
    ]
    first = llm.chat(messages, GREEDY)[0]
    second = llm.chat(messages, GREEDY)[0]
    assert second.usage["cached_tokens"] > 0
    assert first.usage["cached_tokens"] < second.usage["cached_tokens"]
    assert first.token_ids == second.token_ids


def test_seeded_sampling_is_reproducible(llm: met.LLM) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=16)
    ids = _chat_ids(llm, PROMPTS[2])
    a = llm.generate(prompt_token_ids=ids, sampling_params=params)[0]
    b = llm.generate(prompt_token_ids=ids, sampling_params=params)[0]
    assert a.token_ids == b.token_ids


def test_top_k_one_equals_greedy(llm: met.LLM) -> None:
    ids = _chat_ids(llm, PROMPTS[0])
    greedy = llm.generate(prompt_token_ids=ids, sampling_params=GREEDY)[0]
    top1 = SamplingParams(temperature=0.8, top_k=1, seed=7, max_tokens=24)
    assert llm.generate(prompt_token_ids=ids, sampling_params=top1)[0].token_ids == greedy.token_ids


def test_logit_bias_forces_a_token(llm: met.LLM) -> None:
    forced = llm.tokenizer.encode(" banana")[0]
    params = SamplingParams(temperature=0.0, max_tokens=3, logit_bias={forced: 100.0})
    out = llm.generate(prompt_token_ids=_chat_ids(llm, PROMPTS[0]), sampling_params=params)[0]
    assert out.token_ids == [forced] * 3


def test_stop_token_and_min_tokens(llm: met.LLM) -> None:
    ids = _chat_ids(llm, PROMPTS[0])
    free = llm.generate(
        prompt_token_ids=ids, sampling_params=SamplingParams(temperature=0.0, max_tokens=40)
    )[0]
    assert free.finish_reason == "stop"
    n_free = len(free.token_ids)
    floor = SamplingParams(temperature=0.0, max_tokens=40, min_tokens=n_free + 3)
    longer = llm.generate(prompt_token_ids=ids, sampling_params=floor)[0]
    assert len(longer.token_ids) >= n_free + 3
    first = free.token_ids[0]
    stopped = llm.generate(
        prompt_token_ids=ids,
        sampling_params=SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[first]),
    )[0]
    assert stopped.token_ids == [] and stopped.finish_reason == "stop"


def test_stop_string_is_cut(llm: met.LLM) -> None:
    ids = _chat_ids(llm, PROMPTS[0])
    full = llm.generate(prompt_token_ids=ids, sampling_params=GREEDY)[0].text
    stop = full[5:9]
    out = llm.generate(
        prompt_token_ids=ids,
        sampling_params=SamplingParams(temperature=0.0, max_tokens=24, stop=[stop]),
    )[0]
    assert out.text == full[: full.index(stop)]
    assert out.finish_reason == "stop"


def test_stream_matches_generate(llm: met.LLM) -> None:
    messages = [{"role": "user", "content": PROMPTS[1]}]
    whole = llm.chat(messages, GREEDY)[0].text
    assert "".join(d.text for d in llm.stream(messages=messages, sampling_params=GREEDY)) == whole


def test_bad_request_is_a_value_error(llm: met.LLM) -> None:
    with pytest.raises(ValueError, match="temperature"):
        llm.generate(prompts="hi", sampling_params=SamplingParams(temperature=-1))
    with pytest.raises(ValueError, match="maximum context length"):
        llm.generate(prompt_token_ids=[1] * (llm.engine.max_model_len + 1))
    assert llm.engine.blocks.num_used_blocks() == 0
