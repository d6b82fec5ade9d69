"""Structured output through a real server with the official client on the default model: every
kind of constraint on every field that asks for one, streaming and not; unconstrained requests
beside constrained ones; 32 at once; and each bad constraint a 400 the server shrugs off."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest
from server_harness import ServerProcess, start_server

pytestmark = pytest.mark.slow

CAT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,9}$"},
        "age": {"type": "integer", "minimum": 1, "maximum": 30},
    },
    "required": ["name", "age"],
}
LARK = """start: NUMBER | NUMBER OP NUMBER | NUMBER OP NUMBER OP NUMBER
OP: /[+*]/
NUMBER: /[0-9]{1,3}/"""
GBNF = 'root ::= "(" [a-z]+ ")"'
ASK = [{"role": "user", "content": "Describe a cat."}]
# 1.7 kB that would compile to 2^12 alternatives: llguidance's limits stop it in ~0.1 s.
ALL_OF_BLOWUP = {
    "allOf": [
        {"anyOf": [{"properties": {f"a{i}": {"type": "integer"}}}, {"properties": {f"b{i}": {}}}]}
        for i in range(12)
    ]
}


def _valid_cat(text: str) -> bool:
    jsonschema.validate(json.loads(text), CAT)
    return True


KINDS = {
    "response_format-json_schema": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": CAT}}},
        _valid_cat,
    ),
    "response_format-json_object": (
        {"response_format": {"type": "json_object"}},
        lambda t: isinstance(json.loads(t), dict),
    ),
    "structured_outputs-json": ({"structured_outputs": {"json": CAT}}, _valid_cat),
    "structured_outputs-regex": (
        {"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}},
        lambda t: re.fullmatch("[0-9]{3}-[0-9]{4}", t),
    ),
    "structured_outputs-choice": (
        {"structured_outputs": {"choice": ["cat", "dog"]}},
        lambda t: t in ("cat", "dog"),
    ),
    "structured_outputs-lark": (
        {"structured_outputs": {"grammar": LARK}},
        lambda t: re.fullmatch(r"[0-9]{1,3}([+*][0-9]{1,3})*", t),
    ),
    "structured_outputs-json_object": (
        {"structured_outputs": {"json_object": True}},
        lambda t: isinstance(json.loads(t), dict),
    ),
    "guided_json-text": ({"guided_json": json.dumps(CAT)}, _valid_cat),
    "guided_regex": ({"guided_regex": "(yes|no)"}, lambda t: t in ("yes", "no")),
    "guided_choice": ({"guided_choice": ["red", "blue"]}, lambda t: t in ("red", "blue")),
    "guided_grammar-gbnf": ({"guided_grammar": GBNF}, lambda t: re.fullmatch(r"\([a-z]+\)", t)),
}


@pytest.fixture(scope="module")
def server():
    proc = start_server("--max-model-len", "512")
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    return server.openai(timeout=300)


def _model(client) -> str:
    return client.models.list().data[0].id


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_on_chat(client, kind: str, stream: bool) -> None:
    extra, valid = KINDS[kind]
    out = client.chat.completions.create(
        model=_model(client), messages=ASK, max_tokens=60, temperature=0, stream=stream,
        extra_body=extra,
    )  # fmt: skip
    if stream:
        chunks = list(out)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        text, finish = out.choices[0].message.content, out.choices[0].finish_reason
    assert finish == "stop" and valid(text), text


@pytest.mark.parametrize("kind", ["structured_outputs-json", "guided_choice", "guided_regex"])
def test_completions_too(client, kind: str) -> None:
    extra, valid = KINDS[kind]
    out = client.completions.create(
        model=_model(client), prompt="A cat:", max_tokens=60, temperature=0, extra_body=extra
    )
    assert out.choices[0].finish_reason == "stop" and valid(out.choices[0].text)


def test_unconstrained_requests_beside_constrained_ones_are_unchanged(server) -> None:
    async def run() -> tuple[list[str], list[str]]:
        client = server.async_openai(timeout=300)
        model = (await client.models.list()).data[0].id

        async def plain(prompt: str):
            out = await client.completions.create(
                model=model, prompt=prompt, max_tokens=20, temperature=1.0, seed=4
            )
            return out.choices[0].text

        async def shaped():
            return await client.chat.completions.create(
                model=model, messages=ASK, max_tokens=40, temperature=1.0, seed=2,
                extra_body=KINDS["structured_outputs-json"][0],
            )  # fmt: skip

        prompts = ["The capital of France is", "Once upon a time"]
        alone = [await plain(p) for p in prompts]
        mixed = await asyncio.gather(shaped(), plain(prompts[0]), shaped(), plain(prompts[1]))
        return alone, [mixed[1], mixed[3]]

    alone, mixed = asyncio.run(run())
    assert alone == mixed


def test_32_concurrent_constrained_requests_all_finish_valid(server) -> None:
    async def run():
        client = server.async_openai(timeout=600)
        model = (await client.models.list()).data[0].id
        return await asyncio.gather(
            *(
                client.chat.completions.create(
                    model=model,
                    messages=ASK,
                    max_tokens=60,
                    temperature=1.0,
                    seed=i,
                    extra_body=KINDS["response_format-json_schema"][0],
                )  # fmt: skip
                for i in range(32)
            )
        )

    for out in asyncio.run(run()):
        assert out.choices[0].finish_reason == "stop" and _valid_cat(out.choices[0].message.content)


BAD = {
    "unenforceable-keyword": ({"guided_json": {"uniqueItems": True}}, "guided_json"),
    "broken-schema": ({"structured_outputs": {"json": {"type": 5}}}, "structured_outputs.json"),
    "schema-not-json": ({"guided_json": "{not json"}, "guided_json"),
    "broken-regex": ({"guided_regex": "a("}, "guided_regex"),
    "look-around": ({"structured_outputs": {"regex": "(?!a)b"}}, "structured_outputs.regex"),
    "broken-lark": ({"guided_grammar": "start: missing_rule"}, "guided_grammar"),
    "broken-gbnf": ({"guided_grammar": "root ::= ("}, "guided_grammar"),
    "stop-token-in-grammar": ({"guided_grammar": 'start: "a" <|im_end|>'}, "guided_grammar"),
    "two-at-once": (
        {"guided_regex": "a", "response_format": {"type": "json_object"}},
        "guided_regex",
    ),
    "too-large": ({"guided_choice": [f"choice {i:06d}" for i in range(20000)]}, "guided_choice"),
    "over-the-compile-limits": ({"guided_json": ALL_OF_BLOWUP}, "guided_json"),
    "ignore-eos": ({"guided_choice": ["yes", "no"], "ignore_eos": True}, "ignore_eos"),
}  # fmt: skip


@pytest.mark.parametrize(("extra", "param"), list(BAD.values()), ids=list(BAD))
def test_bad_constraints_are_400s_and_the_server_goes_on(server, extra: dict, param: str) -> None:
    body = {"messages": ASK, "max_tokens": 5, **extra}
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.text
        assert len(response.content) < 1000 and "Traceback" not in response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param
        if "two" in param or extra.get("response_format"):
            assert "response_format" in error["message"] and "guided_regex" in error["message"]
        ok = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 3})
        assert ok.status_code == 200, ok.text
