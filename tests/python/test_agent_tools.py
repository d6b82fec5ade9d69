"""Tools and structured output through the Anthropic Messages and OpenAI Responses APIs: history
round trips, forced calls (tool_choice, enforced by the grammar), the same call as chat makes."""

from __future__ import annotations

import json

import anthropic
import pytest
from agent_clients import GREEDY, wire
from server_harness import ServerProcess

pytestmark = pytest.mark.slow

ASK = "Name three colours."

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_tool_history_round_trips(claude: anthropic.Anthropic, oai) -> None:
    ask = {"role": "user", "content": "Weather in Oslo?"}
    call = {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Oslo"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny, 20 C"}
    history = [ask, {"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
    tools = [{"name": "get_weather", "input_schema": WEATHER}]
    message = claude.messages.create(
        model="m", max_tokens=8, extra_body=GREEDY, tools=tools, messages=history
    )
    assert message.content and message.usage.output_tokens > 0
    shorter = claude.messages.count_tokens(model="m", tools=tools, messages=[ask])
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens > shorter.input_tokens
    response = oai.responses.create(
        model="m",
        max_output_tokens=8,
        temperature=0,
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER}],
        input=[
            ask,
            {
                "type": "function_call",
                "call_id": "call_01",
                "name": "get_weather",
                "arguments": '{"city": "Oslo"}',
            },
            {"type": "function_call_output", "call_id": "call_01", "output": "Sunny, 20 C"},
        ],
    )
    assert response.output and response.usage.output_tokens > 0


COLOUR = {
    "type": "object",
    "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
    "required": ["colour"],
    "additionalProperties": False,
}


def test_structured_output_through_both_apis(claude: anthropic.Anthropic, oai) -> None:
    fmt = {"type": "json_schema", "name": "colour", "schema": COLOUR, "strict": True}
    response = oai.responses.create(
        model="m", input=ASK, max_output_tokens=24, temperature=0, text={"format": fmt}
    )
    assert json.loads(response.output_text)["colour"] in ("red", "green", "blue")
    assert response.text.format.type == "json_schema"
    message = claude.messages.create(
        model="m",
        max_tokens=24,
        messages=[{"role": "user", "content": ASK}],
        output_config={"format": {"type": "json_schema", "schema": COLOUR}},
        extra_body=GREEDY,
    )
    assert json.loads(message.content[0].text)["colour"] in ("red", "green", "blue")


WEATHER_TOOL = {"name": "get_weather", "description": "Weather of a city", "input_schema": WEATHER}
WEATHER_FN = {"type": "function", "name": "get_weather", "parameters": WEATHER}
OSLO = [{"role": "user", "content": "What is the weather in Oslo?"}]


def test_forced_tool_use_through_messages(
    agent_proc: ServerProcess, claude: anthropic.Anthropic
) -> None:
    kwargs = dict(
        model="m",
        max_tokens=40,
        extra_body=GREEDY,
        messages=OSLO,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    message = claude.messages.create(**kwargs)
    assert message.stop_reason == "tool_use"
    call = message.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather"
    assert isinstance(call.input["city"], str) and call.id
    with claude.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert final.content[-1].input == call.input and final.stop_reason == "tool_use"
    body = {**{k: v for k, v in kwargs.items() if k != "extra_body"}, **GREEDY, "stream": True}
    events = wire(agent_proc, "/v1/messages", body)
    start = next(
        d
        for n, d in events
        if n == "content_block_start" and d["content_block"]["type"] == "tool_use"
    )
    assert start["content_block"]["input"] == {}
    fragments = [
        d["delta"]["partial_json"]
        for n, d in events
        if n == "content_block_delta" and d["index"] == start["index"]
    ]
    assert fragments and json.loads("".join(fragments)) == call.input
    again = claude.messages.create(
        model="m",
        max_tokens=8,
        extra_body=GREEDY,
        tools=[WEATHER_TOOL],
        messages=[
            *OSLO,
            {"role": "assistant", "content": [c.model_dump() for c in message.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny"}],
            },
        ],
    )
    assert again.content


def _respond(oai, tools: list, tool_choice="required", input=None, **extra):
    """A greedy Responses call offering `tools` (to the Oslo weather question by default)."""
    extra.setdefault("max_output_tokens", 40)
    return oai.responses.create(
        model="m", input=input or OSLO, tools=tools, tool_choice=tool_choice, temperature=0, **extra
    )


def test_forced_function_call_round_trip_through_responses(oai) -> None:
    first = _respond(oai, [WEATHER_FN], {"type": "function", "name": "get_weather"})
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.id.startswith("fc_") and call.call_id
    assert isinstance(json.loads(call.arguments)["city"], str)
    answer = oai.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}],
        tools=[WEATHER_FN],
        max_output_tokens=8,
        temperature=0,
    )
    assert answer.output and answer.usage.input_tokens > first.usage.input_tokens
    stream = _respond(oai, [WEATHER_FN], stream=True)
    events = list(stream)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert done and done[0].arguments == deltas == call.arguments


def test_forced_custom_and_namespaced_calls(oai) -> None:
    patch = {"type": "custom", "name": "apply_patch", "description": "Apply a patch to files"}
    readme = [{"role": "user", "content": "Add a README."}]
    choice = {"type": "custom", "name": "apply_patch"}
    custom = _respond(oai, [patch, {"type": "web_search"}], choice, readme, max_output_tokens=60)
    item = custom.output[-1]
    assert item.type == "custom_tool_call" and item.name == "apply_patch"
    assert isinstance(item.input, str) and item.call_id
    namespace = {
        "type": "namespace",
        "name": "weather",
        "description": "Weather tools",
        "tools": [{**WEATHER_FN, "name": "today"}],
    }
    namespaced = _respond(oai, [namespace])
    call = namespaced.output[-1]
    assert (call.type, call.name, call.namespace) == ("function_call", "today", "weather")


def test_same_greedy_tool_call_through_chat_messages_and_responses(claude, oai) -> None:
    chat = oai.chat.completions.create(
        model="m",
        messages=OSLO,
        max_tokens=40,
        temperature=0,
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
        tool_choice="required",
    )
    chat_call = chat.choices[0].message.tool_calls[0].function
    message = claude.messages.create(
        model="m",
        max_tokens=40,
        extra_body=GREEDY,
        messages=OSLO,
        tools=[{"name": "get_weather", "input_schema": WEATHER}],
        tool_choice={"type": "any"},
    )
    response = _respond(oai, [WEATHER_FN])
    call = response.output[-1]
    assert chat_call.name == message.content[-1].name == call.name == "get_weather"
    assert (
        json.loads(chat_call.arguments) == message.content[-1].input == json.loads(call.arguments)
    )
