"""Structured output with a JSON schema: what compiles, and the automaton walking documents that
match it, or not, byte by byte."""

from __future__ import annotations

import json
import random

import pytest
from test_json_mode import assert_json_answer

from met.model.json_mode import JsonPrefix
from met.model.json_schema import SchemaError, compile_schema
from met.sampling import SamplingParams

CAT = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "weight": {"type": "number"},
        "colour": {"enum": ["black", "white", "ginger"]},
        "indoor": {"type": "boolean"},
        "owner": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "toys": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
    },
    "required": ["name", "age", "colour"],
    "additionalProperties": False,
}
TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"v": {"type": "integer"}, "kids": {"items": {"$ref": "#/$defs/node"}}},
            "required": ["v"],
        }
    },
    "$ref": "#/$defs/node",
}


def _accepts(schema: dict, text: str) -> bool:
    prefix = JsonPrefix(compile_schema(schema))
    return prefix.feed(text.encode()) and prefix.complete


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "Tom", "age": 3, "colour": "black"}',
        '{"colour": "ginger", "age": 0, "name": "é\\"", "indoor": false, "owner": null}',
        '{"name": "T", "age": -12, "colour": "white", "weight": 4.5e0, "toys": ["a", "b"]}',
        '{ "owner" : "Ann" , "name":"x","age":1,"colour":"black" }',
    ],
)
def test_documents_that_match_are_accepted(text: str) -> None:
    assert _accepts(CAT, text)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"name": "Tom", "age": 3}', "a required key is missing"),
        ('{"name": "Tom", "age": 3, "colour": "blue"}', "not in the enum"),
        ('{"name": "Tom", "age": 3.5, "colour": "black"}', "age is an integer"),
        ('{"name": "Tom", "age": 3, "colour": "black", "cat": 1}', "an undeclared key"),
        ('{"name": "Tom", "name": "Tim", "age": 3, "colour": "black"}', "a repeated key"),
        ('{"name": 5, "age": 3, "colour": "black"}', "name is a string"),
        ('{"name": "T", "age": 3, "colour": "black", "toys": []}', "minItems"),
        ('{"name": "T", "age": 3, "colour": "black", "toys": ["a", "b", "c"]}', "maxItems"),
        ('{"name": "T", "age": 3, "colour": "black", "owner": 7}', "anyOf"),
        ('["Tom"]', "the root is an object"),
    ],
)
def test_documents_that_do_not_match_are_refused(text: str, why: str) -> None:
    assert not _accepts(CAT, text), why


def test_a_missing_required_key_still_leaves_a_way_on() -> None:
    prefix = JsonPrefix(compile_schema(CAT))
    assert prefix.feed(b'{"name": "Tom", "age": 3')
    assert not prefix.copy().feed(b"}")  # colour is required
    assert prefix.copy().feed(b', "colour": "bl')  # a prefix of "black"
    assert not prefix.copy().feed(b', "colour": "bu')


def test_recursive_references() -> None:
    assert _accepts(TREE, '{"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4}]}]}')
    assert not _accepts(TREE, '{"v": 1, "kids": [{"w": 2}]}')  # v is required, below too


def test_free_parts_of_a_schema_take_any_json() -> None:
    schema = {"type": "object", "properties": {"a": {}}, "additionalProperties": True}
    assert _accepts(schema, '{"a": [1, {"b": null}], "z": "more"}')
    assert _accepts({"type": "array"}, '[1, "x", {"k": [true]}]')


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "string", "pattern": "a+"}, "'pattern' is not supported"),
        ({"type": "integer", "minimum": 0}, "'minimum' is not supported"),
        ({"allOf": [{"type": "string"}]}, "'allOf' is not supported"),
        ({"type": "date"}, "type: must be one or more of"),
        ({"properties": {"a": {}}, "required": ["b"]}, "'b' is not among the properties"),
        ({"$ref": "#/$defs/missing"}, "points nowhere"),
        ({"$ref": "https://example.com/s.json"}, "only local references"),
        ({"enum": [{"a": 1}]}, "must be scalars"),
        ({"type": "array", "minItems": 3, "maxItems": 1}, "maxItems is below minItems"),
    ],
)
def test_schemas_met_cannot_enforce_are_refused_by_name(schema: dict, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        compile_schema(schema)
    with pytest.raises(ValueError, match="^response_format: "):
        SamplingParams(json_schema=schema).validate()


def _instance(rng: random.Random) -> dict:
    out = {"name": rng.choice(["Tom", "é", 'q"uote']), "age": rng.randint(-5, 30)}
    out["colour"] = rng.choice(["black", "white", "ginger"])
    if rng.random() < 0.5:
        out["toys"] = ["x"] * rng.randint(1, 2)
    if rng.random() < 0.5:
        out["owner"] = rng.choice([None, "Ann"])
    keys = list(out)
    rng.shuffle(keys)
    return {k: out[k] for k in keys}


def test_random_matching_documents_are_accepted_byte_by_byte() -> None:
    rng = random.Random(1)
    node = compile_schema(CAT)
    for _ in range(200):
        text = json.dumps(_instance(rng), indent=rng.choice([None, 2]), ensure_ascii=False)
        prefix = JsonPrefix(node)
        for byte in text.encode():
            assert prefix.feed(bytes([byte])), text
        assert prefix.complete


@pytest.mark.slow
def test_the_default_model_fills_a_schema(default_model_path) -> None:
    import met

    params = SamplingParams(temperature=0.0, max_tokens=200, json_schema=CAT)
    with met.LLM(model=str(default_model_path)) as llm:
        out = llm.chat([{"role": "user", "content": "Describe a cat."}], params)[0]
    assert_json_answer(out.text, out.finish_reason)
    if out.finish_reason == "stop":
        cat = json.loads(out.text)
        assert {"name", "age", "colour"} <= set(cat) <= set(CAT["properties"])
        assert cat["colour"] in ("black", "white", "ginger") and isinstance(cat["age"], int)
