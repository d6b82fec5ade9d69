"""Tools and structured output through the Anthropic Messages and OpenAI Responses APIs: history
round trips, forced calls (tool_choice, enforced by the grammar), the same call as chat makes."""

from __future__ import annotations

import json

import anthropic
import pytest
from agent_clients import GREEDY, agent_server, claude_client, openai_client
from server_harness import ServerProcess

pytestmark = pytest.mark.slow

ASK = "Name three colours."


@pytest.fixture(scope="module")
def server():
    proc = agent_server()
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def claude(server: ServerProcess) -> anthropic.Anthropic:
    return claude_client(server)


@pytest.fixture(scope="module")
def oai(server: ServerProcess):
    return openai_client(server)


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
