"""The Messages and Responses converters without a model: requests onto ChatRequest, typed events
onto each API's frames, the Responses store."""

from __future__ import annotations

import asyncio
import json

import pytest

from met.chat.types import Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallStart, Usage
from met.sampling import Constraint
from met.server.body import parse_body
from met.server.errors import APIError
from met.server.event_stream import with_heartbeat
from met.server.messages import convert as messages_convert
from met.server.messages.protocol import MessagesBody
from met.server.messages.render import MessageRenderer, error_status_and_body
from met.server.responses import convert as responses_convert
from met.server.responses.protocol import ResponsesBody
from met.server.responses.render import ResponseRenderer
from met.server.responses.store import ResponseStore

BILLING = "x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli; cch=36ee5;"


def _messages(**body) -> MessagesBody:
    return parse_body(json.dumps({"max_tokens": 16, **body}).encode(), MessagesBody)


def _chat(**body):
    parsed = _messages(**body)
    return messages_convert.to_chat_request(parsed, messages_convert.sampling_params(parsed))


def test_attribution_block_dropped_whatever_its_nonce() -> None:
    def system(nonce: str) -> list[dict]:
        return [
            {"type": "text", "text": BILLING.replace("36ee5", nonce)},
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": f"{BILLING}\nRules.\n"},
        ]

    msgs = [{"role": "user", "content": "hi"}]
    first = _chat(system=system("36ee5"), messages=msgs).messages[0]
    second = _chat(system=system("0aaa9"), messages=msgs).messages[0]
    assert first == second and first.content == "You are Claude Code.\n\nRules.\n"
    assert _chat(system=f"{BILLING}\nBe brief.", messages=msgs).messages[0].content == "Be brief."


def test_messages_content_blocks_onto_chat_messages() -> None:
    request = _chat(
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Look it up.", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "is_error": True,
                        "content": [{"type": "text", "text": "timeout"}],
                    },
                    {"type": "text", "text": "Try again."},
                ],
            },
        ],
        tools=[{"name": "get", "input_schema": {"type": "object"}, "cache_control": {}}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 64},
        max_tokens=128,
    )
    user, assistant, tool, again = request.messages
    assert (user.role, user.content) == ("user", "Weather?")
    assert assistant.reasoning == "Look it up." and assistant.content == "Checking."
    call = assistant.tool_calls[0]
    assert (call.id, call.name, json.loads(call.arguments)) == ("toolu_1", "get", {"city": "Oslo"})
    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "toolu_1", "Error: timeout")
    assert again.content == "Try again."
    assert request.tool_choice == "required" and request.parallel_tool_calls is False
    assert request.enable_thinking is True and request.max_thinking_tokens == 64


@pytest.mark.parametrize(
    ("block", "says"),
    [
        ({"type": "image", "source": {}}, "no vision"),
        ({"type": "server_tool_use"}, "'server_tool_use' is not supported"),
    ],
)
def test_messages_unsupported_blocks_are_400s(block: dict, says: str) -> None:
    with pytest.raises(APIError) as e:
        _chat(messages=[{"role": "user", "content": [block]}])
    assert e.value.status == 400 and says in e.value.message
    assert e.value.param == "messages[0].content[0]"


def test_messages_bad_fields_are_400s() -> None:
    for body in ({"max_tokens": 0}, {"messages": []}, {"max_tokens": "5"}):
        with pytest.raises(APIError) as e:
            parse_body(
                json.dumps(
                    {"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], **body}
                ).encode(),
                MessagesBody,
            )
        assert e.value.status == 400


def test_anthropic_error_types() -> None:
    cases = [
        (APIError(400, "bad"), 400, "invalid_request_error"),
        (APIError(401, "key"), 401, "authentication_error"),
        (APIError(404, "model"), 404, "not_found_error"),
        (APIError(503, "full", code="queue_full"), 529, "overloaded_error"),
        (APIError(500, "boom"), 500, "api_error"),
    ]
    for error, status, kind in cases:
        got_status, body = error_status_and_body(error)
        assert got_status == status and body == {
            "type": "error",
            "error": {"type": kind, "message": error.message},
        }


def _sse(frames: list[bytes]) -> list[tuple[str, dict]]:
    out = []
    for raw in frames:
        head, data = raw.decode().rstrip("\n").split("\n")
        out.append((head.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


EVENTS = [
    ReasoningDelta("Hmm."),
    TextDelta("Sure"),
    TextDelta("."),
    ToolCallStart(0, "call_abcdefghij", "get"),
    ToolCallDelta(0, '{"city": '),
    ToolCallDelta(0, '"Oslo"}'),
    Finish("tool_calls"),
]


def test_message_stream_order_and_final_message() -> None:
    renderer = MessageRenderer("msg_1", "claude-x", 10)
    frames = renderer.start()
    for event in EVENTS:
        frames += renderer.feed(event)
    frames += renderer.end(Usage(10, 7, cached_tokens=4))
    names = [name for name, _ in _sse(frames)]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    events = _sse(frames)
    assert events[0][1]["message"]["usage"]["input_tokens"] == 10
    starts = [d for n, d in events if n == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2]
    assert starts[2]["content_block"] == {
        "type": "tool_use",
        "id": "call_abcdefghij",
        "name": "get",
        "input": {},
    }
    deltas = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]
    assert deltas == [
        "thinking_delta",
        "text_delta",
        "text_delta",
        "input_json_delta",
        "input_json_delta",
    ]
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"] == {
        "input_tokens": 6,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4,
        "output_tokens": 7,
    }
    message = renderer.message(Usage(10, 7, cached_tokens=4))
    assert [b["type"] for b in message["content"]] == ["thinking", "text", "tool_use"]
    assert message["content"][1]["text"] == "Sure." and message["content"][2]["input"] == {
        "city": "Oslo"
    }


def test_message_stop_reasons() -> None:
    for finish, reason, sequence in [
        (Finish("stop"), "end_turn", None),
        (Finish("length"), "max_tokens", None),
        (Finish("stop", "END"), "stop_sequence", "END"),
    ]:
        renderer = MessageRenderer("msg_1", "m", 3)
        renderer.feed(TextDelta("a"))
        renderer.feed(finish)
        message = renderer.message(Usage(3, 1))
        assert (message["stop_reason"], message["stop_sequence"]) == (reason, sequence)


def _responses(**body) -> ResponsesBody:
    return parse_body(json.dumps(body).encode(), ResponsesBody)


def test_responses_items_onto_chat_messages() -> None:
    body = _responses(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Think."}]},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "read",
                "namespace": "fs",
                "arguments": '{"path": "a"}',
            },
            {
                "type": "custom_tool_call",
                "call_id": "call_2",
                "name": "apply_patch",
                "input": "*** Begin",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "text of a"},
        ],
        tools=[
            {
                "type": "namespace",
                "name": "fs",
                "description": "files",
                "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}],
            },
            {
                "type": "custom",
                "name": "apply_patch",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
            },
            {"type": "web_search"},
        ],
        tool_choice={"type": "function", "name": "read", "namespace": "fs"},
        reasoning={"effort": "low"},
        store=False,
        include=["reasoning.encrypted_content"],
    )
    converted = responses_convert.to_chat_request(body, [])
    system, developer, user, assistant, tool = converted.request.messages
    assert (system.content, developer.role, user.content) == ("Be brief.", "system", "Hi")
    assert assistant.reasoning == "Think."
    assert [c.name for c in assistant.tool_calls] == ["fs__read", "apply_patch"]
    assert json.loads(assistant.tool_calls[1].arguments) == {"input": "*** Begin"}
    assert (tool.tool_call_id, tool.content) == ("call_1", "text of a")
    assert [t.name for t in converted.request.tools] == ["fs__read", "apply_patch"]
    assert "start: /.+/" in json.dumps(converted.request.tools[1].parameters)
    assert converted.names["fs__read"].namespace == "fs" and converted.names["apply_patch"].custom
    assert converted.request.tool_choice == {"name": "fs__read"}
    assert converted.request.reasoning_effort == "low"


def test_responses_unknown_item_type_is_a_400_naming_it() -> None:
    with pytest.raises(APIError) as e:
        responses_convert.to_chat_request(
            _responses(input=[{"type": "item_reference", "id": "x"}]), []
        )
    assert e.value.status == 400 and "'item_reference'" in e.value.message
    assert e.value.param == "input[0].type"


def test_responses_json_schema_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body = _responses(
        input="x", text={"format": {"type": "json_schema", "name": "s", "schema": schema}}
    )
    params = responses_convert.sampling_params(body)
    assert params.constraint == Constraint("json_schema", schema, "text.format")


def _events(frames: list[bytes]) -> list[dict]:
    return [data for _, data in _sse(frames)]


def test_response_stream_events_and_body() -> None:
    names = {
        "apply_patch": responses_convert.ToolName("apply_patch", None, True),
        "fs__read": responses_convert.ToolName("read", "fs"),
    }
    renderer = ResponseRenderer({"id": "resp_1", "object": "response", "model": "m"}, names)
    frames = renderer.start()
    for event in [
        ReasoningDelta("Hm."),
        TextDelta("Ok"),
        ToolCallStart(0, "call_aaaaaaaaa", "fs__read"),
        ToolCallDelta(0, '{"path": "a"}'),
        ToolCallStart(1, "call_bbbbbbbbb", "apply_patch"),
        ToolCallDelta(1, '{"input": "*** Begin'),
        ToolCallDelta(1, '\\n"}'),
        Finish("tool_calls"),
    ]:
        frames += renderer.feed(event)
    frames += renderer.end(Usage(9, 5, cached_tokens=3, reasoning_tokens=2))
    events = _events(frames)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert (
        kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    )
    assert "response.reasoning_text.delta" in kinds and "response.output_text.done" in kinds
    assert "response.function_call_arguments.delta" in kinds
    assert "response.custom_tool_call_input.done" in kinds
    response = events[-1]["response"]
    reasoning, message, call, custom = response["output"]
    assert reasoning["id"].startswith("rs_") and message["id"].startswith("msg_")
    assert message["content"][0] == {
        "type": "output_text",
        "text": "Ok",
        "annotations": [],
        "logprobs": [],
    }
    assert (call["type"], call["name"], call["namespace"], call["call_id"]) == (
        "function_call",
        "read",
        "fs",
        "call_aaaaaaaaa",
    )
    assert call["id"].startswith("fc_") and call["arguments"] == '{"path": "a"}'
    assert (custom["type"], custom["input"]) == ("custom_tool_call", "*** Begin\n")
    assert response["usage"]["input_tokens_details"] == {"cached_tokens": 3}
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}
    assert response["status"] == "completed"


def test_response_incomplete_and_failed() -> None:
    renderer = ResponseRenderer({"id": "resp_1"}, {})
    renderer.feed(TextDelta("a"))
    renderer.feed(Finish("length"))
    last = _events(renderer.end(Usage(3, 1)))[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    failed = _events(ResponseRenderer({"id": "resp_2"}, {}).fail("context_length_exceeded", "long"))
    assert failed[0]["response"]["error"]["code"] == "context_length_exceeded"


def test_store_bounds_by_count_and_age_lru_first() -> None:
    now = [0.0]
    store = ResponseStore(max_responses=2, max_age_s=10, clock=lambda: now[0])
    for name in ("a", "b"):
        store.put({"id": name}, [])
    assert store.get("a") is not None  # "a" used last: "b" goes first
    store.put({"id": "c"}, [])
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2
    now[0] = 11.0
    assert store.get("a") is None and len(store) == 0
    store.put({"id": "d"}, [])
    assert store.delete("d") and not store.delete("d")


def test_heartbeat_while_nothing_comes() -> None:
    async def slow():
        await asyncio.sleep(0.35)
        yield "first"
        yield "second"

    async def run() -> list:
        return [event async for event in with_heartbeat(slow(), 0.1)]

    seen = asyncio.run(run())
    assert seen[-2:] == ["first", "second"] and 2 <= seen.count(None) <= 4
    assert set(seen[:-2]) == {None}
