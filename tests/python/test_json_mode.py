"""JSON mode: the byte automaton against Python's json module, the per-token constraint, the
sampler's pick among allowed tokens, and the default model answering in JSON."""

from __future__ import annotations

import json
import random

import pytest
import torch

from met.model.json_mode import JsonConstraint, JsonPrefix
from met.model.sampler import RowParams, SampleSpec, sample
from met.sampling import SamplingParams

VALID = [
    "{}",
    '{"a": 1}',
    ' \n{ "k" : "v" } ',
    '{"a": [1, 2.5, -0.1e+3, 0, true, false, null, "x\\u00e9\\n\\"q"], "b": {"c": {}}}',
    '{"é": "ü", "emoji": "\U0001f600"}',
]
INVALID = [
    "[]",  # JSON mode's value is an object
    "1",
    "{a}",
    '{"a" 1}',
    '{"a": 01}',
    '{"a": -}',
    '{"a": 1.}',
    '{"a": 1e}',
    '{"a": tru}',
    '{"a": [1,]}',
    '{"a":1,}',
    '{"a": "\x01"}',
    '{"a": "\\q"}',
    '{"a": "\\u12G4"}',
    "{}}",
    '{"a": 1} x',
    "{" + " " * 21 + "}",  # whitespace runs are capped
    '{\n\n"a": 1}',  # one line break per run
]


def _complete(text: str) -> bool:
    prefix = JsonPrefix()
    return prefix.feed(text.encode()) and prefix.complete


@pytest.mark.parametrize("text", VALID)
def test_valid_objects_and_every_prefix_of_them(text: str) -> None:
    assert _complete(text)
    data = text.encode()
    for end in range(len(data)):
        prefix = JsonPrefix()
        assert prefix.feed(data[:end]), data[:end]
        assert prefix.complete == _parses(data[:end]), data[:end]


def _parses(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data), dict)
    except ValueError:
        return False


@pytest.mark.parametrize("text", INVALID)
def test_invalid_texts_are_refused(text: str) -> None:
    assert not _complete(text)


def _random_value(rng: random.Random, depth: int = 0):
    if depth > 3 or rng.random() < 0.3:
        return rng.choice([0, 1, -2.5, 3e-10, 12345678901234, 's\u00e9\n"q\\', True, False, None])
    if rng.random() < 0.5:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def test_whatever_json_dumps_writes_is_accepted_byte_by_byte() -> None:
    rng = random.Random(0)
    for _ in range(300):
        text = json.dumps(
            {"root": _random_value(rng)},
            indent=rng.choice([None, 1]),
            ensure_ascii=rng.random() < 0.5,
        )
        prefix = JsonPrefix()
        for byte in text.encode():
            assert prefix.copy().feed(bytes([byte])) and prefix.feed(bytes([byte])), text
        assert prefix.complete


VOCAB = [b"{", b"}", b'"a"', b":", b" 1", b"<eos>", b"x", b'{"', b"\xc3", b"\xa9", b""]
EOS, SPECIAL = 5, 10


def _constraint() -> JsonConstraint:
    return JsonConstraint(VOCAB, special_ids=[EOS, SPECIAL], eos_ids=[EOS])


def test_constraint_follows_the_output_and_allows_eos_only_when_complete() -> None:
    c = _constraint()

    def allowed() -> list[int]:
        return [t for t in range(len(VOCAB) + 2) if c.allows(t)]  # ids past the table: never

    c.sync([])
    assert allowed() == [0, 7]  # "{" and '{"'
    c.sync([7])  # '{"': inside a key any text goes, structure or not; specials never
    assert allowed() == [0, 1, 3, 4, 6, 7, 8, 9]
    c.sync([7, 8, 9])  # the key holds an é whose two bytes came as two tokens
    assert not c.allows(EOS)
    c = _constraint()
    c.sync([0, 2])  # '{"a"': a colon must follow
    assert allowed() == [3]


def test_constraint_after_the_object_allows_only_the_end() -> None:
    c = _constraint()
    assert c.end_token() is None
    c.sync([0, 2, 3, 4, 1])  # {"a": 1}
    allowed = [t for t in range(len(VOCAB)) if c.allows(t)]
    assert allowed == [EOS] and c.end_token() == EOS


def _spec(temperature: float, allowed, seed: int = 1) -> SampleSpec:
    return SampleSpec(RowParams(temperature=temperature, seed=seed), allowed=allowed)


def test_the_sampler_takes_the_best_allowed_token() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    odd = lambda t: t % 2 == 1  # noqa: E731
    assert sample(logits, [_spec(0.0, odd)])[0].token == 1
    assert sample(logits, [_spec(0.0, None)])[0].token == 0
    # Drawn: only allowed tokens come out, in proportion to their probabilities.
    draws = [sample(logits, [_spec(1.0, odd, seed)])[0].token for seed in range(200)]
    assert set(draws) <= {1, 3, 5} and draws.count(1) > draws.count(3) > draws.count(5)


def test_a_complete_value_ends_the_output_unless_min_tokens_holds_it() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0]])  # the model would rather go on (token 0)
    spec = SampleSpec(RowParams(temperature=0.0), allowed=lambda t: True, end=lambda: 3)
    assert sample(logits, [spec])[0].token == 3
    spec.mask_stop, spec.stop_tokens = True, [3]
    assert sample(logits, [spec])[0].token == 0
    drawn = SampleSpec(RowParams(temperature=1.0, seed=2), allowed=lambda t: True, end=lambda: 3)
    assert sample(logits, [drawn])[0].token == 3


def test_the_sampler_leaves_top_k_when_it_kept_no_allowed_token() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0]])
    # Top-2 keeps tokens 0 and 1, neither allowed.
    spec = SampleSpec(RowParams(temperature=1.0, top_k=2, seed=3), allowed=lambda t: t == 2)
    assert sample(logits, [spec])[0].token == 2


def assert_json_answer(text: str, finish_reason: str) -> None:
    """A finished answer is one JSON object; one cut by max_tokens is a prefix of one."""
    prefix = JsonPrefix()
    assert prefix.feed(text.encode()), text
    if finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text
        assert text == text.rstrip(), "the output ends with the value, not with padding"
    else:
        assert finish_reason == "length" and not prefix.complete


ASKS = [
    "Describe a cat with its name, age and colour.",
    "What is the capital of France? Answer in JSON.",
    "Give a JSON object with a person's first and last name.",
]


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_default_model_answers_in_json(default_model_path, temperature) -> None:
    import met

    params = SamplingParams(temperature=temperature, seed=5, max_tokens=200, json_object=True)
    with met.LLM(model=str(default_model_path)) as llm:
        outs = [llm.chat([{"role": "user", "content": ask}], params)[0] for ask in ASKS]
        assert not llm.engine.backend.json_constraints  # dropped with the finished requests
    for out in outs:
        assert_json_answer(out.text, out.finish_reason)
    # A 135M model can loop inside an object until max_tokens; these asks end, but which of them
    # does depends on the last bits of the CPU's arithmetic.
    assert any(out.finish_reason == "stop" for out in outs)
