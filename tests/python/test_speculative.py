"""Speculative decoding is exact: greedy and seeded output with prompt-lookup drafts equals the
plain engine's token for token (default model through the C++ forward, a random model through
the torch forward), stops and limits land where they do without drafts, logprobs come from the
row that produced each token, structured output drafts under its grammar (each draft position
masked by the grammar advanced along the draft, rolled back over rejected ones) with the same
tokens, verify rows fused with prefill chunks change nothing, and penalised requests run without
drafts (and say so)."""

from __future__ import annotations

import json

import pytest
from model_fixtures import byte_tokenizer_json, random_weights, save_hf_folder, tiny_config

import met
from met.sampling import Constraint, SamplingParams

pytestmark = pytest.mark.slow

CODE = "\n".join(
    f"def compute_{i}(value):\n    result = value * {i}\n    return result + {i}\n"
    for i in range(6)
)
COPY = [
    f"Rename compute to calc in this code and print the whole file:\n{code}"
    for code in (CODE, CODE.replace("value", "x"))
] + ["Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox."]


@pytest.fixture(scope="module")
def engines(default_model_path) -> dict[str, met.LLM]:
    path = str(default_model_path)
    return {
        mode: met.LLM(model=path, max_prefill_tokens=64, speculative=mode)
        for mode in ("off", "ngram-forced", "ngram")
    }


def _ids(llm: met.LLM, text: str) -> list[int]:
    return llm.tokenizer.encode_chat([{"role": "user", "content": text}])


def _run(llm: met.LLM, prompts: list[str], params: SamplingParams):
    return llm.generate(prompt_token_ids=[_ids(llm, p) for p in prompts], sampling_params=params)


def _accepted(llm: met.LLM) -> int:
    return llm.engine.scheduler.spec_stats().accepted


def _same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert x.finish_reason == y.finish_reason
        assert x.text == y.text


@pytest.mark.parametrize("mode", ["ngram-forced", "ngram"])
def test_greedy_batch_is_token_for_token_the_plain_output(engines, mode) -> None:
    # Gated, the planner cuts drafts to what it expects to pay on this machine: whatever it
    # keeps, the tokens are the plain ones; copying prompts still get drafts taken.
    params = SamplingParams(temperature=0.0, max_tokens=40)
    before = _accepted(engines[mode])
    plain = _run(engines["off"], COPY + ["Write a story about a cat."], params)
    spec = _run(engines[mode], COPY + ["Write a story about a cat."], params)
    _same(plain, spec)
    assert _accepted(engines[mode]) > before  # drafts were verified and taken
    engines[mode].engine.blocks.check_invariants()


def test_seeded_sampling_and_logprobs_are_unchanged(engines) -> None:
    params = SamplingParams(temperature=0.7, seed=11, max_tokens=32, logprobs=2)
    plain = _run(engines["off"], COPY[:2], params)
    spec = _run(engines["ngram-forced"], COPY[:2], params)
    _same(plain, spec)
    for x, y in zip(plain, spec, strict=True):
        assert x.outputs[0].logprobs == y.outputs[0].logprobs


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=7),
        SamplingParams(temperature=0.0, max_tokens=60, stop=["calc_2"]),
        SamplingParams(temperature=0.0, max_tokens=60, stop_token_ids=[28]),
    ],
    ids=["max_tokens", "stop_string", "stop_token"],
)
def test_limits_and_stops_end_where_they_do_without_drafts(engines, params) -> None:
    _same(_run(engines["off"], COPY[:1], params), _run(engines["ngram-forced"], COPY[:1], params))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=24),
        SamplingParams(temperature=0.7, top_p=0.5, seed=5, max_tokens=24, logprobs=1),
    ],
    ids=["greedy", "seeded"],
)
def test_verify_rows_fused_with_prefill_chunks_change_nothing(engines, params) -> None:
    # The short request decodes (drafting "the quick brown fox") while the long one's prompt is
    # still prefilled in 64-token chunks: its verify rows ride in those forwards. The long
    # prompt starts differently per case, so the prefix cache cannot shorten its prefill. The
    # seeded case keeps to the top half of the mass (top_p 0.5): at temperature 0.7 alone some
    # draws wander off the sentence before a draft is proposed (seed 5 did on the AMX path), and
    # then no verify row is fused at all.
    prompts = [COPY[2], f"Case {params.temperature}. {COPY[0]}{COPY[1]}"]
    llm = engines["ngram-forced"]
    before = llm.engine.scheduler.spec_stats().fused_verify_steps
    plain, spec = _run(engines["off"], prompts, params), _run(llm, prompts, params)
    _same(plain, spec)
    for x, y in zip(plain, spec, strict=True):
        assert x.outputs[0].logprobs == y.outputs[0].logprobs
    assert llm.engine.scheduler.spec_stats().fused_verify_steps > before
    llm.engine.blocks.check_invariants()


RECORDS = [{"id": i, "name": f"item{i}", "tags": ["a", "b"]} for i in range(4)]
SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["id", "name", "tags"],
    },
}
JSON_COPY = [f"Repeat this JSON exactly: {json.dumps(RECORDS)}", "Write three records as JSON."]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=48),
        SamplingParams(temperature=0.8, seed=3, max_tokens=48),
    ],
    ids=["greedy", "seeded"],
)
def test_structured_output_drafts_and_gives_the_same_tokens(engines, params) -> None:
    params.constraint = Constraint("json_schema", SCHEMA)
    llm = engines["ngram-forced"]
    before = llm.engine.scheduler.spec_stats()
    plain = _run(engines["off"], JSON_COPY, params)
    spec = _run(llm, JSON_COPY, params)
    _same(plain, spec)
    after = llm.engine.scheduler.spec_stats()
    assert after.drafted > before.drafted  # the constrained requests carried drafts
    assert after.accepted > before.accepted
    assert "grammar" not in llm.engine.stats().speculation.requests_off
    llm.engine.blocks.check_invariants()


# A max_tokens lexeme (the thinking budget's kind) makes llguidance refuse to roll its matcher
# back: the drafts are walked on a copy, so the grammar still holds after a draft.
CAPPED = "%llguidance {}\nstart: lead body\nlead[max_tokens=2]: /[^{]*/\nbody: /[^\\nA-Z]*/\n"


def test_a_grammar_that_cannot_roll_back_drafts_and_gives_the_same_tokens(engines) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=48)
    params.constraint = Constraint("lark", CAPPED)
    llm = engines["ngram-forced"]
    before = llm.engine.scheduler.spec_stats()
    plain = _run(engines["off"], JSON_COPY[:1], params)
    spec = _run(llm, JSON_COPY[:1], params)
    _same(plain, spec)
    assert all("\n" not in out.text for out in spec)
    assert llm.engine.scheduler.spec_stats().accepted > before.accepted


def test_penalised_requests_run_without_drafts_and_say_why(engines) -> None:
    llm = engines["ngram-forced"]
    params = SamplingParams(temperature=0.0, max_tokens=16, frequency_penalty=0.5)
    before_drafted = llm.engine.scheduler.spec_stats().drafted
    before_off = llm.engine.stats().speculation.requests_off.get("penalties", 0)
    _same(_run(engines["off"], COPY[2:], params), _run(llm, COPY[2:], params))
    assert llm.engine.scheduler.spec_stats().drafted == before_drafted
    assert llm.engine.stats().speculation.requests_off["penalties"] == before_off + 1


def test_random_model_torch_forward_greedy_identity(tmp_path) -> None:
    config = tiny_config(vocab=256)
    save_hf_folder(tmp_path, config, random_weights(config, seed=5))
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json())
    # Prompts that repeat themselves draft on every step; a random model rejects most drafts, so
    # rollbacks run all the time.
    prompts = [[30 + (j % (3 + i)) for j in range(40)] for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = {}
    for mode in ("off", "ngram-forced"):
        llm = met.LLM(
            str(tmp_path), "float32", device="cpu", max_prefill_tokens=16, speculative=mode
        )
        outs[mode] = llm.generate(prompt_token_ids=prompts, sampling_params=params)
        llm.engine.blocks.check_invariants()
        if mode != "off":
            assert llm.engine.scheduler.spec_stats().verify_steps > 0
    _same(outs["off"], outs["ngram-forced"])
