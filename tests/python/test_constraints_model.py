"""Structured output on the default model through the engine: random schemas sampled at
temperature 1 all validate, regexes match, choices are in the set, arithmetic parses; JSON mode
and a schema at temperature 0; unconstrained rows untouched by constrained ones beside them; a
preempted constrained sequence resumes with its grammar state."""

from __future__ import annotations

import ast
import json
import random
import re

import jsonschema
import pytest
from constraint_support import assert_json_answer
from model_fixtures import exhaust_kv_once

from met.sampling import Constraint, SamplingParams

pytestmark = pytest.mark.slow

PROMPT = "Here is the answer, as the user asked:\n"
# Bounded (a weak model would otherwise chain operators until max_tokens).
ARITHMETIC = """
start: expr
expr: term | term OP term | term OP term OP term
term: NUMBER | "(" NUMBER OP NUMBER ")"
OP: "+" | "-" | "*"
NUMBER: /[1-9][0-9]{0,2}/
"""


@pytest.fixture(scope="module")
def llm(default_model_path):
    import met

    with met.LLM(model=str(default_model_path)) as llm:
        yield llm


def _scalar(rng: random.Random) -> dict:
    return rng.choice(
        [
            {"type": "integer", "minimum": rng.randint(-50, 0), "maximum": rng.randint(1, 500)},
            {"type": "string", "maxLength": rng.randint(1, 8)},
            {"type": "string", "pattern": rng.choice(["^[a-z]{1,6}$", "^[A-Z][0-9]{2}$"])},
            {"enum": rng.sample(["red", "green", "blue", 7, None, True], 3)},
            {"type": "boolean"},
            {"type": "number", "minimum": 0, "maximum": 10, "multipleOf": 0.5},
            {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"}]},
            {"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 99}]},
        ]
    )


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """Nested objects and arrays of bounded scalars: every value the model may write ends."""
    roll = rng.random()
    if depth >= 2 or roll < 0.3:
        return _scalar(rng)
    if roll < 0.55:
        items = random_schema(rng, depth + 1)
        return {"type": "array", "items": items, "minItems": 1, "maxItems": rng.randint(1, 3)}
    keys = rng.sample(["id", "name", "kind", "size", "tags", "meta"], rng.randint(1, 3))
    props = {k: random_schema(rng, depth + 1) for k in keys}
    required = rng.sample(keys, rng.randint(1, len(keys)))
    return {"type": "object", "properties": props, "required": required}


def _run(llm, constraints: list[Constraint], seed: int = 0, **kw) -> list:
    params = [
        SamplingParams(temperature=1.0, seed=seed + i, max_tokens=256, constraint=c, **kw)
        for i, c in enumerate(constraints)
    ]
    return llm.generate([PROMPT] * len(params), params)


def test_random_schemas_sampled_at_temperature_one_all_validate(llm) -> None:
    rng = random.Random(14)
    schemas = [{"type": "object", "properties": {"v": random_schema(rng)}} for _ in range(12)]
    for schema in schemas:
        schema["required"] = ["v"]
    outs = _run(llm, [Constraint("json_schema", s) for s in schemas])
    for schema, out in zip(schemas, outs, strict=True):
        assert out.finish_reason == "stop", (schema, out.text)
        jsonschema.validate(json.loads(out.text), schema)


def test_regexes_choices_and_a_grammar(llm) -> None:
    regexes = [r"[0-9]{3}-[0-9]{4}", r"(yes|no), because [a-z ]{1,20}\.", r"#[0-9a-f]{6}"]
    choices = ["Paris", "Lyon", "Marseille"]
    constraints = [Constraint("regex", r) for r in regexes] + [Constraint("choice", choices)] * 3
    constraints += [
        Constraint("lark", ARITHMETIC),
        Constraint("gbnf", 'root ::= [0-9]{1,3} "+" [0-9]{1,3}'),
    ]
    outs = _run(llm, constraints, seed=3)
    for r, out in zip(regexes, outs, strict=False):
        assert re.fullmatch(r, out.text), (r, out.text)
    assert all(out.text in choices for out in outs[3:6])
    for out in outs[6:]:
        assert out.finish_reason == "stop" and re.fullmatch(r"[0-9+\-*() ]+", out.text), out.text
        assert isinstance(eval(compile(ast.parse(out.text, mode="eval"), "", "eval")), int)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_json_mode_answers_end_with_the_object(llm, temperature) -> None:
    asks = ["Describe a cat with its name, age and colour.", "Give a person's first name."]
    params = SamplingParams(
        temperature=temperature, seed=5, max_tokens=200, constraint=Constraint("json_object")
    )
    outs = [llm.chat([{"role": "user", "content": ask}], params)[0] for ask in asks]
    assert not llm.engine.backend.constraints  # dropped with the finished requests
    for out in outs:
        assert_json_answer(out.text, out.finish_reason)
    assert any(out.finish_reason == "stop" for out in outs)


def test_unconstrained_rows_beside_constrained_ones_get_their_own_tokens(llm) -> None:
    plain = [SamplingParams(temperature=t, seed=9, max_tokens=24) for t in (0.0, 1.0)]
    prompts = ["The capital of France is", "Once upon a time"]
    alone = llm.generate(prompts, plain)
    schema = Constraint("json_schema", {"type": "object", "properties": {"a": {"type": "string"}}})
    tight = SamplingParams(temperature=1.0, seed=1, max_tokens=40, constraint=schema)
    mixed = llm.generate(
        [prompts[0], PROMPT, prompts[1], PROMPT], [plain[0], tight, plain[1], tight]
    )
    assert [o.token_ids for o in alone] == [mixed[0].token_ids, mixed[2].token_ids]


def test_a_preempted_constrained_sequence_keeps_its_state(default_model_path) -> None:
    from met.config import EngineConfig
    from met.engine.core import EngineCore

    numbers = {"type": "integer", "minimum": 100, "maximum": 999}
    numbers = {"type": "array", "items": numbers, "minItems": 12, "maxItems": 12}
    schema = {"type": "object", "properties": {"items": numbers}, "required": ["items"]}
    params = SamplingParams(
        temperature=0.0, max_tokens=200, constraint=Constraint("json_schema", schema)
    )
    engine = EngineCore(EngineConfig(model=str(default_model_path)))
    backend = engine.backend
    calls = exhaust_kv_once(backend, 12)
    prompt = engine.tokenizer.encode("List many numbers as JSON: ")
    texts = {f"r{i}": "" for i in range(4)}
    for name in texts:
        engine.add_request(name, prompt, params)
    while engine.has_work():
        for delta in engine.step():
            texts[delta.request_id] += delta.text
    assert len(calls) > 12 and not backend.constraints
    for text in texts.values():
        jsonschema.validate(json.loads(text), schema)
    assert len(set(texts.values())) == 1  # greedy: preempted or not, the same answer
