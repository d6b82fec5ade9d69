"""`met serve --model <tiny qwen35moe.gguf>`: chat, plain and streamed, and a forced tool call in
Qwen3.5's XML format (the qwen3_coder parser, chosen from the template) through the openai and
the anthropic clients."""

from __future__ import annotations

import json

import jsonschema
import pytest
from agent_clients import GREEDY, KEY, claude_client
from hybrid_fixtures import build, write_gguf
from server_harness import start_server

pytestmark = pytest.mark.slow

ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = build("qwen35moe", max_position_embeddings=1024)  # room for the tools' prompt
    path = write_gguf(model, tmp_path_factory.mktemp("q") / "m.gguf", "qwen35moe")
    proc = start_server(
        "--model", str(path), "--served-model-name", "qwen35moe", "--max-thinking-tokens", "4",
        api_key=KEY,
    )  # fmt: skip
    yield proc
    assert proc.stop() == 0


def test_chat_plain_and_streamed(server):
    with server.http() as http:
        model = http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert model["data"][0]["tool_call_format"] == "qwen3_coder"
    client = server.openai()
    ask = dict(model="qwen35moe", messages=ASK, max_tokens=6, temperature=0, extra_body=NO_THINKING)
    reply = client.chat.completions.create(**ask)
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    assert 1 <= reply.usage.completion_tokens <= 6
    stream = client.chat.completions.create(**ask, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == choice.message.content


def test_the_next_turn_resumes_where_the_last_ones_history_ended(server):
    # The template renders a past reply without the empty think block its generation prompt
    # opened, so the first prompt's last full block is not the next turn's; the checkpoint at
    # the end of the rendered history (before the generation prompt) is.
    client = server.openai()
    ask = [{"role": "system", "content": "Be brief. " * 8}, {"role": "user", "content": "hello"}]
    args = dict(model="qwen35moe", max_tokens=4, temperature=0, extra_body=NO_THINKING)
    first = client.chat.completions.create(messages=ask, **args)
    reply = {"role": "assistant", "content": first.choices[0].message.content}
    turn = client.chat.completions.create(messages=[*ask, reply, ask[1]], **args)
    cached = turn.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0 and cached < first.usage.prompt_tokens


def test_forced_tool_call_through_openai_and_anthropic(server):
    client = server.openai()
    out = client.chat.completions.create(
        model="qwen35moe",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=200,  # a token per byte: the vocabulary is byte-level
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), CITY)
    claude = claude_client(server)
    message = claude.messages.create(
        model="qwen35moe",
        max_tokens=200,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[{"name": "get_weather", "description": "Weather of a city", "input_schema": CITY}],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert message.stop_reason == "tool_use"
    use = message.content[-1]
    assert use.type == "tool_use" and use.name == "get_weather"
    jsonschema.validate(use.input, CITY)
