"""A function tool's arguments schema must be an object schema on every route, as OpenAI and
Anthropic answer: {"type": "string"} is a 400 naming `tools`, checked before anything is
queued (no model needed)."""

from __future__ import annotations

import json

import pytest

from met.sampling import SamplingParams
from met.server.body import parse_body
from met.server.chat_request import chat_request
from met.server.errors import APIError
from met.server.messages import convert as messages_convert
from met.server.messages.protocol import MessagesBody
from met.server.protocol import ChatCompletionBody
from met.server.responses import convert as responses_convert
from met.server.responses.protocol import ResponsesBody

USER = {"role": "user", "content": "hi"}
OBJECT = {"type": "object", "properties": {"city": {"type": "string"}}}


def _chat(schema: dict):
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    body = parse_body(
        json.dumps({"messages": [USER], "tools": [tool]}).encode(), ChatCompletionBody
    )
    return chat_request(body, SamplingParams())


def _messages(schema: dict):
    raw = {"max_tokens": 8, "messages": [USER], "tools": [{"name": "f", "input_schema": schema}]}
    body = parse_body(json.dumps(raw).encode(), MessagesBody)
    return messages_convert.to_chat_request(body, messages_convert.sampling_params(body))


def _responses(schema: dict):
    tool = {"type": "function", "name": "f", "parameters": schema}
    body = parse_body(json.dumps({"input": "hi", "tools": [tool]}).encode(), ResponsesBody)
    return responses_convert.to_chat_request(body, [])


ROUTES = {
    "chat": (_chat, "function.parameters"),
    "messages": (_messages, "input_schema"),
    "responses": (_responses, "parameters"),
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("kind", ["string", "array"])
def test_a_non_object_tool_schema_is_a_400_naming_tools(route: str, kind: str) -> None:
    convert, field = ROUTES[route]
    with pytest.raises(APIError) as e:
        convert({"type": kind})
    assert (e.value.status, e.value.param) == (400, "tools")
    assert e.value.message.startswith(f"tools[0].{field}: invalid schema for 'f': ")
    assert f"got 'type: '{kind}''" in e.value.message


@pytest.mark.parametrize("route", ROUTES)
def test_object_schemas_and_untyped_ones_pass(route: str) -> None:
    convert, _ = ROUTES[route]
    for schema in (OBJECT, {"properties": {}}):
        convert(schema)
