"""Thinking through the Messages and Responses APIs: a tiny random-weight model with a Qwen3-style
template (met.chat's <think> splitter), the thinking budget forcing </think>, then a forced call."""

from __future__ import annotations

import json

import anthropic
import pytest
from agent_clients import GREEDY, sse
from chat_model import write_qwen3_style_model
from server_harness import ServerProcess, start_server

pytestmark = pytest.mark.slow

# A short bound on the string: the byte-level vocabulary spends a token per byte.
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
}
OSLO = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    folder = write_qwen3_style_model(tmp_path_factory.mktemp("qwen3_style"))
    # The server's thinking budget ends a random model's thinking where a request sets none.
    proc = start_server(
        "--model", str(folder), "--served-model-name", "*", "--max-thinking-tokens", "6"
    )
    yield proc
    assert proc.stop() == 0


def test_messages_thinking_block_then_tool_use(server: ServerProcess) -> None:
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    kwargs = dict(
        model="m",
        max_tokens=200,
        messages=OSLO,
        tools=[{"name": "get_weather", "input_schema": WEATHER}],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 3},
        extra_body=GREEDY,
    )
    message = claude.messages.create(**kwargs)
    assert [block.type for block in message.content] == ["thinking", "tool_use"]
    assert message.content[0].thinking and message.stop_reason == "tool_use"
    assert isinstance(message.content[1].input["city"], str)
    body = {**{k: v for k, v in kwargs.items() if k != "extra_body"}, **GREEDY, "stream": True}
    with server.http() as http, http.stream("POST", "/v1/messages", json=body) as response:
        events = sse(list(response.iter_lines()))
    deltas = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]
    assert deltas[0] == "thinking_delta" and deltas[-1] == "input_json_delta"
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert starts == ["thinking", "tool_use"]


def test_responses_reasoning_item_then_function_call(server: ServerProcess) -> None:
    oai = server.openai()
    response = oai.responses.create(
        model="m",
        input=OSLO,
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER}],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
        temperature=0,
    )
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "function_call"], kinds
    assert response.output[0].id.startswith("rs_") and response.output[0].content[0].text
    assert isinstance(json.loads(response.output[1].arguments)["city"], str)
    assert response.usage.output_tokens_details.reasoning_tokens > 0
