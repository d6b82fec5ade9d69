"""Prefix caching of a hybrid model through the engine (met.engine.hybrid): a repeated prompt, the
next turn of a chat and another prompt with the same opening resume from recurrent-state
checkpoints at block boundaries (inside a prompt, at its last full block, before its rendered
history's end, and where a reply's decode passed its last one), report the tokens they reused as
cached_tokens and give the tokens an engine without a prefix cache gives, on the torch forward (a
float32 file) and on the C++ one (Q8_0 blocks)."""

from __future__ import annotations

import dataclasses

import pytest
from gguf_writing import Q
from hybrid_fixtures import build, write_gguf

import met
from met.engine import hybrid
from met.engine.torch_backend import TorchBackend

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
        assert cached == 48  # 40 + 9 positions ran: the first reply's decode passed 48
        assert _run(llm, turn) == (reply, 48)
        assert llm.engine.stats().prefix_cache_hit_tokens == 32 + 48 + 48
    assert [first, first, reply] == [again, *_uncached(hybrid_file, [PROMPT, turn])]


def test_a_verify_row_that_passes_a_boundary_leaves_the_state_after_that_token(hybrid_file):
    # The reply's first verify row starts at 47: the checkpoint at 48 is its first token's state
    # (the state after its last token, the drafts, is another); 40 + 19 positions run, so the
    # next turn resumes from it. Its logprobs are a cold engine's, which prefills the reply where
    # the first engine decoded it: on Q8_0 blocks the two round activations differently (the
    # measured spread is 0.011; the state after the drafts gives 0.17, 0.14 in float32).
    prompt = [0] * 8 + PROMPT[:32]
    params = met.SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    scored = met.SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=0)
    options = dict(OPTIONS, speculative="ngram-forced")
    runs = {}
    for cache in (True, False):
        with met.LLM(model=hybrid_file, **dict(options, enable_prefix_cache=cache)) as llm:
            (out,) = llm.generate(prompt_token_ids=[prompt], sampling_params=params)
            turn = prompt + out.token_ids + [7, 8, 9]
            (reply,) = llm.generate(prompt_token_ids=[turn], sampling_params=scored)
            runs[cache] = reply.outputs[0], reply.usage.get("cached_tokens", 0)
            assert llm.engine.stats().speculation.verify_steps > 0
    (hit, cached), (miss, _) = runs[True], runs[False]
    assert cached == 48 and hit.token_ids == miss.token_ids
    tolerance = 0.05 if hybrid_file.endswith("Q8_0.gguf") else 1e-4
    for a, b in zip(hit.logprobs, miss.logprobs, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=tolerance)


@pytest.mark.parametrize("speculative", ["off", "ngram-forced"])
def test_a_reply_keeps_one_checkpoint_at_the_last_block_its_decode_passed(hybrid_file, speculative):
    # A prompt whose reply has verify rows passing 48 and 96 (drafts rejected, 96 passed again).
    prompt = [0] * 8 + PROMPT[:32]
    params = met.SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    options = dict(OPTIONS, state_checkpoints=3, speculative=speculative)
    with met.LLM(model=hybrid_file, **options) as llm:
        (out,) = llm.generate(prompt_token_ids=[prompt], sampling_params=params)
        turn = prompt + out.token_ids + [7, 8, 9]
        reply, cached = _run(llm, turn)
        assert cached == 96  # 40 + 59 positions ran: the decode passed 48, 64, 80 and 96
        spec = llm.engine.stats().speculation
        # It kept only 96's: the prompt's own (32) is still among the three (the turn's reply
        # took the third).
        assert _run(llm, prompt)[1] == 32
    if speculative != "off":
        assert spec.verify_steps > 0 and spec.drafted > spec.accepted
    assert reply == _uncached(hybrid_file, [turn])[0]


def test_the_next_turn_resumes_where_the_last_prompts_history_ended(hybrid_file):
    # A chat prompt is its history, then a generation prompt that the next turn's rendering of
    # the history does not repeat: its last full block (48) covers both, so only the checkpoint
    # at the history's end (SamplingParams.history_end, 40: the block boundary 32) resumes it.
    first = PROMPT + [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    turn = PROMPT + [20, 21, 22, 23, 24, 25, 26, 27]
    marked = dataclasses.replace(GREEDY, history_end=len(PROMPT))
    resumed = {}
    for params in (GREEDY, marked):
        with met.LLM(model=hybrid_file, **OPTIONS) as llm:
            llm.generate(prompt_token_ids=[first], sampling_params=params)
            resumed[params.history_end] = _run(llm, turn)
    assert resumed[None][1] == 0 and resumed[len(PROMPT)][1] == 32
    assert resumed[None][0] == resumed[len(PROMPT)][0] == _uncached(hybrid_file, [turn])[0]


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
    # 36 + 9 positions run: each prompt's only checkpoint is its last full block's (32).
    prompt, other = PROMPT[:36], [(3 * i) % 90 + 4 for i in range(36)]
    with met.LLM(model=hybrid_file, **dict(OPTIONS, state_checkpoints=1)) as llm:
        first, _ = _run(llm, prompt)
        _run(llm, other)  # takes the one checkpoint
        assert _run(llm, prompt) == (first, 0)
        assert _run(llm, prompt) == (first, 32)


def test_a_checkpoint_goes_with_the_block_before_it(hybrid_file):
    # Eight blocks of 16. The first prompt and its reply (46 positions) leave two cached blocks
    # and the checkpoint at 32 after them; the second (110 positions) takes five fresh blocks,
    # the first one's plain third block and its cached second: the checkpoint goes at once,
    # leaving the second prompt's own (at 96) alone in the index.
    first, second = PROMPT[:36], [(3 * i) % 90 + 4 for i in range(100)]
    with met.LLM(model=hybrid_file, **dict(OPTIONS, kv_cache_blocks=8)) as llm:
        index = llm.engine.backend.checkpoints
        tokens, _ = _run(llm, first)
        assert index.num_indexed() == 1
        _run(llm, second)
        assert index.num_indexed() == 1 and index.num_free() == index.count() - 1
        index.check_invariants()
        assert _run(llm, first) == (tokens, 0)


def _turns(path: str, direct: bool) -> tuple[list, tuple, int, int]:
    """A reply with verify rows that pass block boundaries (drafts rejected), then the next turn
    with logprobs, on the core's DirectForward or with every step through the Python backend."""
    prompt = [0] * 8 + PROMPT[:32]
    params = met.SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    scored = met.SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=0)
    with pytest.MonkeyPatch.context() as patch:
        if not direct:
            patch.setattr(TorchBackend, "for_scheduler", lambda self: self)
        with met.LLM(model=path, **dict(OPTIONS, speculative="ngram-forced")) as llm:
            (out,) = llm.generate(prompt_token_ids=[prompt], sampling_params=params)
            turn = prompt + out.token_ids + [7, 8, 9]
            (reply,) = llm.generate(prompt_token_ids=[turn], sampling_params=scored)
            spec, backend = llm.engine.stats().speculation, llm.engine.scheduler_backend
            assert spec.verify_steps > 0 and spec.drafted > spec.accepted
            steps = getattr(backend, "direct_steps", 0)
    logprobs = [p.logprob for p in reply.outputs[0].logprobs]
    return out.token_ids, (reply.token_ids, logprobs), reply.usage["cached_tokens"], steps


def test_the_core_runs_a_hybrids_decode_and_verify_steps_as_the_python_backend(hybrid_file):
    # On Q8_0 blocks (the C++ forward; the float32 file runs the torch forward, which has no
    # direct path): the turn checkpoints the core keeps and the states it puts back after
    # rejected drafts give the next turn the same cached prefix, tokens and logprobs, bit for bit.
    if not hybrid_file.endswith("Q8_0.gguf"):
        pytest.skip("the C++ forward runs quantized blocks")
    *direct, steps = _turns(hybrid_file, direct=True)
    *python, none = _turns(hybrid_file, direct=False)
    assert steps > 0 and none == 0
    assert direct == python and direct[2] == 96
