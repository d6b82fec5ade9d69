"""Structured output without a model: what compiles (and the 400 messages of what does not),
the schema semantics met adds, one sequence's matcher (sync, rollback, preemption replay), the
masks computed in the background, and the sampler restricted to the allowed tokens."""

from __future__ import annotations

import pytest
import torch
from constraint_support import accepts, byte_tokenizer

from met.constraints import (
    MAX_CONSTRAINT_BYTES,
    MaskPrefetch,
    ModelGrammar,
    check,
    grammar_kind,
)
from met.model.sampler import RowParams, SampleSpec, sample
from met.sampling import Constraint, SamplingParams

CAT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "colour": {"enum": ["black", "white", "ginger"]},
    },
    "required": ["name", "age", "colour"],
}
LARK_CALL = 'start: <tool_call> %json{"type": "object", "properties": {"x": {"type": "integer"}}}'
N_VOCAB = 264  # lm_head rows past the tokenizer's 259 ids are padding


def _nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def _all_of_blowup(n: int) -> dict:
    """Small, but 2^n alternatives once compiled: a hostile schema the limits must stop."""
    return {
        "allOf": [
            {
                "anyOf": [
                    {"properties": {f"a{i}": {"type": "integer"}}},
                    {"properties": {f"b{i}": {}}},
                ]
            }
            for i in range(n)
        ]
    }


@pytest.fixture(scope="module")
def grammar(tmp_path_factory) -> ModelGrammar:
    return ModelGrammar(byte_tokenizer(tmp_path_factory.mktemp("tok")), N_VOCAB)


def _ids(text: str) -> list[int]:
    return list(text.encode())  # the byte tokenizer: id = byte


def _allowed(grammar: ModelGrammar, state) -> set[int]:
    masks = MaskPrefetch(grammar.n_vocab)
    row = masks.take(0, state, state.consumed)
    bits = ((row[:, None] >> torch.arange(32, dtype=torch.int32)) & 1).reshape(-1)
    return {int(i) for i in torch.nonzero(bits[: grammar.n_vocab]).flatten()}


@pytest.mark.parametrize(
    ("c", "message"),
    [
        (Constraint("json_schema", {"type": "array", "uniqueItems": True}), "uniqueItems"),
        (Constraint("json_schema", {"type": "strin"}), "strin"),
        (Constraint("json_schema", [1]), "must be an object"),
        (Constraint("regex", "(?=a)b", "guided_regex"), "look-around"),
        (Constraint("regex", "a(", "guided_regex"), "unclosed group"),
        (Constraint("lark", "start: foo", "guided_grammar"), "unknown name"),
        (Constraint("gbnf", "root ::= foo", "guided_grammar"), "foo"),
        (Constraint("choice", [], "guided_choice"), "non-empty list"),
        (Constraint("json_schema", {"enum": ["x" * MAX_CONSTRAINT_BYTES]}), "byte limit"),
        (Constraint("json_schema", _nested(100)), "nests deeper than 64"),
        (Constraint("json_schema", _all_of_blowup(12)), "schema too large"),
    ],
)
def test_refused_constraints_name_their_field_and_the_reason(c: Constraint, message) -> None:
    with pytest.raises(ValueError, match=f"^{c.param}: .*{message}"):
        SamplingParams(constraint=c).validate()


def test_grammar_syntax_is_told_apart_by_its_rules() -> None:
    assert grammar_kind('root ::= "a" | "b"') == "gbnf"
    assert grammar_kind('start: "a" | "b"\n') == "lark"
    gbnf = Constraint("gbnf", 'root ::= "(" [0-9]+ ")"')
    assert accepts(gbnf, "(42)") and not accepts(gbnf, "42")


def test_full_json_schema_is_enforced() -> None:
    c = Constraint("json_schema", CAT)
    assert accepts(c, '{"name": "Tom", "age": 3, "colour": "black"}')
    assert not accepts(c, '{"name": "tom", "age": 3, "colour": "black"}')  # pattern
    assert not accepts(c, '{"name": "Tom", "age": 31, "colour": "black"}')  # maximum
    assert not accepts(c, '{"name": "Tom", "age": 3}')  # required
    assert not accepts(c, '{"name": "Tom", "age": 3, "colour": "black", "x": 1}')  # closed


def test_extra_keys_only_where_the_schema_allows_them() -> None:
    props = {"a": {"type": "integer"}}
    open_ = Constraint("json_schema", {"properties": props, "additionalProperties": True})
    assert accepts(open_, '{"a": 1, "b": 2}')
    assert not accepts(Constraint("json_schema", {"properties": props}), '{"a": 1, "b": 2}')
    both = {"allOf": [{"properties": props}, {"properties": {"b": {"type": "integer"}}}]}
    assert accepts(Constraint("json_schema", both), '{"a": 1, "b": 2}')


def test_whitespace_is_bounded_and_the_value_stands_alone() -> None:
    c = Constraint("json_object")
    assert accepts(c, '{\n  "a": [1, 2],\n  "b": {}\n}')
    assert not accepts(c, '{\n\n"a": 1}', complete=False)  # one line break per run
    assert not accepts(c, "{" + " " * 21 + "}", complete=False)
    assert not accepts(c, ' {"a": 1}', complete=False)
    assert not accepts(c, '{"a": 1} ', complete=False)


def test_special_tokens_by_name_and_stop_tokens_refused(grammar: ModelGrammar) -> None:
    state = grammar.start(Constraint("lark", LARK_CALL))
    assert _allowed(grammar, state) == {257}  # <tool_call> only
    state.extend([257, *_ids('{"x": 12}')])
    assert state.stopped and _allowed(grammar, state) == {256}  # then the stop token only
    with pytest.raises(ValueError, match=r"^guided_grammar: <\|end\|> is a stop token"):
        grammar.check(Constraint("lark", 'start: "a" <|end|>', "guided_grammar"))


def test_the_engine_check_uses_the_model_tokenizer(grammar: ModelGrammar) -> None:
    with pytest.raises(ValueError, match="^response_format: "):
        grammar.check(Constraint("lark", "start: <no_such_token>", "response_format"))
    assert check(Constraint("regex", "[0-9]+"))  # without a tokenizer too


def test_rollback_and_resync_match_a_fresh_replay(grammar: ModelGrammar) -> None:
    c = Constraint("json_schema", CAT)
    text = _ids('{"name": "Tom", "age": 12, ')
    state = grammar.start(c)
    state.extend(text)
    fresh = grammar.start(c)
    fresh.extend(text[:-5])
    state.rollback(5)
    assert state.consumed == fresh.consumed and _allowed(grammar, state) == _allowed(grammar, fresh)
    # A preempted sequence prefilled again with its output: the same output is a no-op; a
    # different one (a rejected draft) rolls back to the common prefix first.
    state.sync(text[:-5])
    assert _allowed(grammar, state) == _allowed(grammar, fresh)
    state.sync(_ids('{"name": "Tim"'))
    fresh = grammar.start(c)
    fresh.extend(_ids('{"name": "Tim"'))
    assert _allowed(grammar, state) == _allowed(grammar, fresh) == {*b", \t\n\r"}


def test_a_refused_token_frees_the_sequence(grammar: ModelGrammar) -> None:
    state = grammar.start(Constraint("choice", ["yes", "no"]))
    assert _allowed(grammar, state) == {ord("y"), ord("n")}
    state.extend(_ids("yes!"))  # only an unmet min_tokens forces a token past the end
    assert state.free and MaskPrefetch(N_VOCAB).take(0, state, state.consumed) is None
    state.rollback(1)  # replays what stays on a fresh matcher
    assert not state.free and _allowed(grammar, state) == {256}


def test_background_masks_equal_the_ones_computed_at_once(grammar: ModelGrammar) -> None:
    states = {i: grammar.start(Constraint("json_schema", CAT)) for i in range(4)}
    for i, state in states.items():
        state.extend(_ids('{"name": "Tom", "age": 1'[: 3 + 4 * i]))
    masks = MaskPrefetch(N_VOCAB)
    masks.start([(i, s, []) for i, s in states.items()])
    masks.wait()  # the matchers are the worker's until then
    at_once = MaskPrefetch(N_VOCAB)
    for i, state in states.items():
        want = at_once.take(99, state, state.consumed)
        assert torch.equal(masks.take(i, state, state.consumed), want)
    states[0].extend(_ids("a"))  # moved after its mask was started: computed again
    want = at_once.take(99, states[0], states[0].consumed)
    assert torch.equal(masks.take(0, states[0], states[0].consumed), want)


def test_masks_after_each_draft_token_leave_the_state_in_place(grammar: ModelGrammar) -> None:
    c = Constraint("json_schema", CAT)
    state = grammar.start(c)
    state.extend(_ids('{"na'))
    before = _allowed(grammar, state)
    drafts = _ids('me": "T')
    masks = MaskPrefetch(N_VOCAB)
    masks.start([(7, state, drafts)])
    masks.wait()
    for j in range(len(drafts) + 1):
        fresh = grammar.start(c)
        fresh.extend(_ids('{"na') + drafts[:j])
        got = masks.take(7, state, state.consumed + drafts[:j])
        assert torch.equal(got, MaskPrefetch(N_VOCAB).take(0, fresh, fresh.consumed)), j
    assert state.consumed == _ids('{"na') and _allowed(grammar, state) == before


def _mask(allowed: set[int], vocab: int) -> torch.Tensor:
    bits = torch.zeros((vocab + 31) // 32 * 32, dtype=torch.int64)
    bits[list(allowed)] = 1
    words = (bits.reshape(-1, 32) << torch.arange(32)).sum(dim=1)
    return words.to(torch.uint32).view(torch.int32) if hasattr(torch, "uint32") else words.int()


def _spec(temperature: float, allowed: set[int], seed: int = 1, **kw) -> SampleSpec:
    return SampleSpec(RowParams(temperature=temperature, seed=seed, **kw), mask=_mask(allowed, 6))


def test_the_sampler_keeps_its_order_among_allowed_tokens() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    odd = {1, 3, 5}
    assert sample(logits, [_spec(0.0, odd)])[0].token == 1
    draws = [sample(logits, [_spec(1.0, odd, seed)])[0].token for seed in range(300)]
    assert set(draws) <= odd and draws.count(1) > draws.count(3) > draws.count(5)
    again = [sample(logits, [_spec(1.0, odd, seed)])[0].token for seed in range(300)]
    assert draws == again  # seeded: reproducible
    # Top-2 of the model's distribution holds no allowed token; the mask comes first.
    assert sample(logits, [_spec(1.0, {2}, top_k=2)])[0].token == 2
    out = sample(logits, [_spec(0.0, odd, top_logprobs=0)])[0]
    assert out.logprob > sample(logits, [_spec(0.0, set(range(6)), top_logprobs=0)])[0].logprob


def test_a_complete_value_ends_unless_min_tokens_holds_it() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0]])  # the model would rather go on (token 0)
    spec = SampleSpec(RowParams(temperature=0.0), mask=_mask({3}, 4))
    assert sample(logits, [spec])[0].token == 3
    spec.mask_stop, spec.stop_tokens = True, [3]  # the stop token is all the grammar allows
    assert sample(logits, [spec])[0].token == 0
    mixed = [SampleSpec(RowParams(temperature=0.0)), SampleSpec(RowParams(), mask=_mask({3}, 4))]
    assert [s.token for s in sample(logits.repeat(2, 1), mixed)] == [0, 3]
