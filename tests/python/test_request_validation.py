"""Checks every route's body gets before anything is queued, without a model: integers within
int64 on every route (one validator on the shared base), tool results and outputs that answer a
call, and a thinking budget that leaves room in max_tokens."""

from __future__ import annotations

import importlib
import json
import pkgutil

import pytest
from pydantic import BaseModel

import met.server
from met.chat.types import ChatMessage, ToolCall
from met.server.body import Body, parse_body
from met.server.errors import APIError
from met.server.messages import convert as messages_convert
from met.server.messages.protocol import CountTokensBody, MessagesBody
from met.server.protocol import ChatCompletionBody, CompletionBody, DetokenizeBody
from met.server.responses import convert as responses_convert
from met.server.responses.protocol import ResponsesBody

BIG = 2**63
USER = {"role": "user", "content": "hi"}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {}}
ASSISTANT = {"role": "assistant", "content": [CALL]}


def _result(tool_use_id: str) -> dict:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": "ok"}


# (body model, body, the param the 400 names): an integer field of each route, at every depth.
PAST_INT64 = [
    (CompletionBody, {"prompt": "x", "best_of": BIG}, "best_of"),
    (CompletionBody, {"prompt": [[1], [2, -BIG - 1]]}, "prompt[1][1]"),
    (ChatCompletionBody, {"messages": [USER], "max_thinking_tokens": BIG}, "max_thinking_tokens"),
    (ChatCompletionBody, {"messages": [USER], "top_logprobs": BIG}, "top_logprobs"),
    (MessagesBody, {"max_tokens": BIG, "messages": [USER]}, "max_tokens"),
    (MessagesBody, {"max_tokens": 8, "top_k": BIG, "messages": [USER]}, "top_k"),
    (
        MessagesBody,
        {
            "max_tokens": 8,
            "messages": [USER],
            "thinking": {"type": "enabled", "budget_tokens": BIG},
        },
        "thinking.budget_tokens",
    ),
    (
        CountTokensBody,
        {"messages": [USER], "thinking": {"type": "enabled", "budget_tokens": BIG}},
        "thinking.budget_tokens",
    ),
    (ResponsesBody, {"input": "x", "max_output_tokens": BIG}, "max_output_tokens"),
    (DetokenizeBody, {"tokens": [1, BIG]}, "tokens[1]"),
]


@pytest.mark.parametrize(("model", "body", "param"), PAST_INT64)
def test_every_route_refuses_an_integer_past_int64(
    model: type[Body], body: dict, param: str
) -> None:
    with pytest.raises(APIError) as e:
        parse_body(json.dumps(body).encode(), model)
    assert (e.value.status, e.value.param) == (400, param)
    assert e.value.message == f"{param}: must fit in a signed 64-bit integer"


def test_int64_bounds_hold_and_free_form_json_passes() -> None:
    body = parse_body(
        json.dumps(
            {
                "max_tokens": BIG - 1,
                "top_k": -BIG,
                "messages": [{"role": "user", "content": "x"}],
                # A tool's schema and metadata are JSON passed on, not numbers met uses.
                "tools": [{"name": "t", "input_schema": {"type": "integer", "maximum": 2**70}}],
                "metadata": {"n": 2**70},
            }
        ).encode(),
        MessagesBody,
    )
    assert (body.max_tokens, body.top_k) == (BIG - 1, -BIG)


def test_every_request_body_of_the_server_is_a_body() -> None:
    # The int64 check lives on Body, so a request model that is not one would skip it.
    for info in pkgutil.walk_packages(met.server.__path__, "met.server."):
        importlib.import_module(info.name)
    models = _subclasses(BaseModel)
    served = [m for m in models if m.__module__.startswith("met.server.")]
    assert len(served) > 20
    assert [m for m in served if not issubclass(m, Body)] == []


def _subclasses(cls: type) -> set[type]:
    out = set(cls.__subclasses__())
    for sub in list(out):
        out |= _subclasses(sub)
    return out


def _messages(max_tokens: int = 16, **body) -> MessagesBody:
    return parse_body(json.dumps({"max_tokens": max_tokens, **body}).encode(), MessagesBody)


def _convert(body: MessagesBody):
    return messages_convert.to_chat_request(body, messages_convert.sampling_params(body))


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([USER, ASSISTANT, {"role": "user", "content": [_result("toolu_2")]}], "messages[2]"),
        ([{"role": "user", "content": [_result("toolu_1")]}], "messages[0]"),
        (
            # Only the turn just before counts: toolu_1 was answered two turns ago.
            [
                USER,
                ASSISTANT,
                {"role": "user", "content": [_result("toolu_1")]},
                {"role": "assistant", "content": "Done."},
                {"role": "user", "content": [_result("toolu_1")]},
            ],
            "messages[4]",
        ),
    ],
)
def test_a_tool_result_for_no_tool_use_is_a_400(messages: list, param: str) -> None:
    body = _messages(messages=messages)
    with pytest.raises(APIError) as e:
        _convert(body)
    assert (e.value.status, e.value.param) == (400, f"{param}.content[0].tool_use_id")
    assert "toolu_" in e.value.message and "no tool_use block" in e.value.message
    count = parse_body(json.dumps({"messages": messages}).encode(), CountTokensBody)
    with pytest.raises(APIError):  # count_tokens converts the same way
        messages_convert.to_chat_request(count, messages_convert.sampling_params(body))


def test_tool_results_answer_the_assistant_turn_before() -> None:
    # Consecutive messages of a role are one turn, as Anthropic joins them.
    second = {**CALL, "id": "toolu_2"}
    request = _convert(
        _messages(
            messages=[
                USER,
                ASSISTANT,
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, second]},
                {"role": "user", "content": [_result("toolu_1")]},
                {"role": "user", "content": [_result("toolu_2")]},
            ]
        )
    )
    assert [m.tool_call_id for m in request.messages if m.role == "tool"] == ["toolu_1", "toolu_2"]


@pytest.mark.parametrize("max_tokens", [16, 4096])
def test_max_tokens_must_exceed_the_thinking_budget(max_tokens: int) -> None:
    body = _messages(
        max_tokens, messages=[USER], thinking={"type": "enabled", "budget_tokens": 4096}
    )
    with pytest.raises(APIError) as e:
        messages_convert.sampling_params(body)
    assert (e.value.status, e.value.param) == (400, "max_tokens")
    assert "thinking.budget_tokens (4096)" in e.value.message


def test_a_thinking_budget_within_max_tokens_passes() -> None:
    enabled = _messages(4097, messages=[USER], thinking={"type": "enabled", "budget_tokens": 4096})
    assert _convert(enabled).max_thinking_tokens == 4096
    adaptive = _messages(16, messages=[USER], thinking={"type": "adaptive", "budget_tokens": 4096})
    assert _convert(adaptive).enable_thinking is True
    with pytest.raises(APIError) as e:
        _messages(16, messages=[USER], thinking={"type": "enabled", "budget_tokens": -1})
    assert e.value.param == "thinking.budget_tokens"


def _responses(*items: dict) -> ResponsesBody:
    return parse_body(json.dumps({"input": [USER, *items]}).encode(), ResponsesBody)


FUNCTION_CALL = {"type": "function_call", "call_id": "call_1", "name": "get", "arguments": "{}"}


@pytest.mark.parametrize("kind", ["function_call_output", "custom_tool_call_output"])
def test_a_function_call_output_for_no_call_is_a_400(kind: str) -> None:
    body = _responses(FUNCTION_CALL, {"type": kind, "call_id": "call_2", "output": "x"})
    with pytest.raises(APIError) as e:
        responses_convert.to_chat_request(body, [])
    assert (e.value.status, e.value.param) == (400, "input[2].call_id")
    assert "No tool call found" in e.value.message and "'call_2'" in e.value.message


def test_a_function_call_output_answers_the_input_or_the_previous_response() -> None:
    output = {"type": "function_call_output", "call_id": "call_1", "output": "x"}
    here = responses_convert.to_chat_request(_responses(FUNCTION_CALL, output), [])
    assert here.history[-1].tool_call_id == "call_1"
    previous = [
        ChatMessage("user", "hi"),
        ChatMessage("assistant", tool_calls=[ToolCall("call_1", "get", "{}")]),
    ]
    follow = responses_convert.to_chat_request(_responses(output), previous)
    assert follow.history[-1].tool_call_id == "call_1"
