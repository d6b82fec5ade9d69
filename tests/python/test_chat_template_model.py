"""The template, reasoning and hermes paths on a tiny random-weight model whose chat template
(tests/python/chat_model.py) is written in Qwen3's format: tools rendered by the template,
thinking split into reasoning_content, the thinking budget forcing </think>, forced calls in
<tool_call> tags; and the same model forced onto the generic format by the flag."""

from __future__ import annotations

import json

import jsonschema
import pytest
from chat_model import write_qwen3_style_model
from server_harness import ServerProcess, start_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
        },
    },
}
SCHEMA = WEATHER["function"]["parameters"]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_qwen3_style_model(tmp_path_factory.mktemp("qwen3-style")))


@pytest.fixture(scope="module")
def server(model_dir: str):
    proc = start_server(
        "--model", model_dir, "--served-model-name", "any", "--max-thinking-tokens", "6"
    )
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    return server.openai()


def forced(client, **extra):
    # One call (the grammar then ends the output); the byte-level vocabulary spends a token
    # per byte, hence the room.
    args = dict(model="any", messages=ASK, tools=[WEATHER], tool_choice="required")
    args |= dict(parallel_tool_calls=False, temperature=0, max_tokens=200)
    return client.chat.completions.create(**args, **extra)


def test_models_name_the_template_format(server: ServerProcess) -> None:
    with server.http() as http:
        model = http.get("/v1/models").json()["data"][0]
    assert (model["tool_call_format"], model["tool_call_format_source"]) == ("hermes", "template")
    assert model["reasoning_parser"] == "qwen3"


def test_thinking_then_a_forced_call(client) -> None:
    out = forced(client, extra_body={"max_thinking_tokens": 3})
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and len(call.id) >= 9
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    reasoning = choice.message.model_extra.get("reasoning_content")
    assert reasoning is not None and "<tool_call>" not in reasoning
    assert 1 <= out.usage.completion_tokens_details.reasoning_tokens <= 3 + 1


def test_stream_splits_reasoning_and_matches_non_stream(client) -> None:
    whole = forced(client).choices[0].message
    reasoning, calls, finishes = "", {}, []
    for chunk in forced(client, stream=True):
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, [call.function.name, ""])
            entry[1] += call.function.arguments or ""
        if chunk.choices[0].finish_reason:
            finishes.append(chunk.choices[0].finish_reason)
    assert finishes == ["tool_calls"]
    assert reasoning == whole.model_extra["reasoning_content"]
    assert list(calls.values()) == [
        [c.function.name, c.function.arguments] for c in whole.tool_calls
    ]


def test_enable_thinking_false_has_no_reasoning(client) -> None:
    out = forced(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = out.choices[0].message
    assert message.model_extra.get("reasoning_content") is None
    assert out.usage.completion_tokens_details.reasoning_tokens == 0
    jsonschema.validate(json.loads(message.tool_calls[0].function.arguments), SCHEMA)


def test_the_server_budget_ends_free_thinking(client) -> None:
    out = client.chat.completions.create(model="any", messages=ASK, temperature=0, max_tokens=40)
    assert out.usage.completion_tokens_details.reasoning_tokens <= 6 + 1
    assert out.choices[0].message.model_extra.get("reasoning_content") is not None


def test_history_with_reasoning_and_calls_renders(server: ServerProcess, client) -> None:
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I should look it up.",
            "tool_calls": [
                {
                    "id": "call_abcdefghi",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abcdefghi", "content": "sunny"},
    ]
    with server.http() as http:
        tokens = http.post("/tokenize", json={"messages": history}).json()["tokens"]
        text = http.post("/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\nsunny\n</tool_response>" in text
    out = client.chat.completions.create(
        model="any", messages=history, tools=[WEATHER], max_tokens=8, temperature=0
    )
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_the_generic_format_by_flag(model_dir: str) -> None:
    proc = start_server(
        "--model", model_dir, "--served-model-name", "any", "--tool-call-parser", "generic"
    )
    try:
        with proc.http() as http:
            model = http.get("/v1/models").json()["data"][0]
        assert (model["tool_call_format"], model["tool_call_format_source"]) == ("generic", "flag")
        out = forced(proc.openai(), extra_body={"max_thinking_tokens": 2})
        (call,) = out.choices[0].message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    finally:
        assert proc.stop() == 0
