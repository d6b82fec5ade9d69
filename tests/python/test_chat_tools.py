"""Tool calling on /v1/chat/completions end to end: a real `met serve` on the default model (a
template without tool support, so the generic format), the `openai` client and the OpenAI
Agents SDK. Forced calls hold whatever the model: the grammar engine enforces them."""

from __future__ import annotations

import asyncio
import json
import time

import jsonschema
import openai
import pytest
from server_harness import ServerProcess, start_server

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 16}},
            "required": ["zone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
GREEDY = {"temperature": 0, "max_tokens": 64}


@pytest.fixture(scope="module")
def server():
    proc = start_server("--max-model-len", "1024", "--served-model-name", "met-tools", "*")
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return server.openai()


def assert_valid_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and len(call.id) >= 9
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert len({c.id for c in calls}) == len(calls)


def test_models_name_the_generic_format_and_any_name_is_echoed(server, client) -> None:
    with server.http() as http:
        models = http.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["met-tools"]
    assert models[0]["tool_call_format"] == "generic"
    out = client.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=2)
    assert out.model == "gpt-4o"


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_call_validates(client, choice: str) -> None:
    tool_choice = {"type": "function", "function": {"name": "get_time"}}
    out = client.chat.completions.create(
        model="met-tools",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required" if choice == "required" else tool_choice,
        max_tokens=96,
        temperature=0.8 if choice == "named" else 0,
        seed=3,
    )
    choice_out = out.choices[0]
    assert choice_out.finish_reason == "tool_calls"
    assert choice_out.message.content is None
    assert_valid_calls(choice_out.message.tool_calls)
    if choice == "named":
        assert {c.function.name for c in choice_out.message.tool_calls} == {"get_time"}


def test_stream_matches_non_stream_for_a_greedy_forced_call(client) -> None:
    args = dict(model="met-tools", messages=ASK, tools=TOOLS, tool_choice="required", **GREEDY)
    whole = client.chat.completions.create(**args).choices[0].message.tool_calls
    chunks = list(client.chat.completions.create(**args, stream=True))
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["tool_calls"]
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if delta.index not in calls:  # the first delta of a call: index, id, type, name
                assert delta.id and len(delta.id) >= 9 and delta.type == "function"
                assert delta.function.name and delta.function.arguments == ""
                calls[delta.index] = {"name": delta.function.name, "arguments": ""}
            else:
                assert delta.id is None and delta.function.name is None
                calls[delta.index]["arguments"] += delta.function.arguments
    assert sorted(calls) == list(range(len(calls)))
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole
    ]


def test_a_forced_call_cut_by_max_tokens_is_a_partial_call_never_content(client) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    args = dict(model="met-tools", messages=ASK, tools=TOOLS, tool_choice=named, temperature=0)
    whole = client.chat.completions.create(**args, max_tokens=64).choices[0].message.tool_calls
    out = client.chat.completions.create(**args, max_tokens=22).choices[0]
    assert out.finish_reason == "length" and out.message.content is None
    (call,) = out.message.tool_calls
    assert call.function.name == "get_weather" and len(call.id) >= 9
    # The arguments written before the limit: the start of the whole call's.
    assert call.function.arguments and whole[0].function.arguments.startswith(
        call.function.arguments
    )
    json.loads(whole[0].function.arguments)
    chunks = list(client.chat.completions.create(**args, max_tokens=22, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any(d.content for d in deltas)
    streamed = "".join(t.function.arguments or "" for d in deltas for t in d.tool_calls or [])
    assert streamed == call.function.arguments


def test_none_never_calls(client) -> None:
    out = client.chat.completions.create(
        model="met-tools", messages=ASK, tools=TOOLS, tool_choice="none", **GREEDY
    )
    assert out.choices[0].message.tool_calls is None
    assert out.choices[0].finish_reason in ("stop", "length")


def test_parallel_calls_off_gives_one_call(client) -> None:
    for seed in range(3):
        out = client.chat.completions.create(
            model="met-tools",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            max_tokens=96,
        )
        calls = out.choices[0].message.tool_calls
        assert len(calls) == 1
        assert_valid_calls(calls)


def test_auto_is_a_call_or_an_answer(client) -> None:
    out = client.chat.completions.create(
        model="met-tools", messages=ASK, tools=TOOLS, tool_choice="auto", **GREEDY
    )
    message, reason = out.choices[0].message, out.choices[0].finish_reason
    if message.tool_calls:
        assert reason == "tool_calls"
        assert_valid_calls(message.tool_calls)
    else:
        assert isinstance(message.content, str) and reason in ("stop", "length")


def test_history_round_trip(client) -> None:
    first = client.chat.completions.create(
        model="met-tools", messages=ASK, tools=TOOLS, tool_choice="required", **GREEDY
    )
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
    ]
    out = client.chat.completions.create(model="met-tools", messages=history, tools=TOOLS, **GREEDY)
    message = out.choices[0].message
    assert message.content or message.tool_calls
    assert out.usage.completion_tokens_details.reasoning_tokens == 0
    assert out.usage.prompt_tokens > first.usage.prompt_tokens


BAD = [
    ("tools", {"tools": [{"type": "retrieval"}]}),
    ("tools", {"tools": [{"type": "function", "function": {"description": "no name"}}]}),
    (
        "tools",
        {
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "not": {}}},
                }
            ]
        },
    ),
    ("tools", {"tools": [WEATHER, WEATHER]}),
    ("tool_choice", {"tools": TOOLS, "tool_choice": "sometimes"}),
    (
        "tool_choice",
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    ),
    ("tool_choice", {"tool_choice": "required"}),
    (
        "messages[1].tool_calls[0].function.arguments",
        {
            "messages": [
                *ASK,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "call_123456789",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{not json"},
                        }
                    ],
                },
            ]
        },
    ),
    ("messages[1].tool_call_id", {"messages": [*ASK, {"role": "tool", "content": "21"}]}),
]


@pytest.mark.parametrize(("param", "extra"), BAD, ids=[f"{i}-{p}" for i, (p, _) in enumerate(BAD)])
def test_bad_input_is_a_400_naming_it(server: ServerProcess, param: str, extra: dict) -> None:
    body = {"model": "met-tools", "messages": ASK, "max_tokens": 4, **extra}
    with server.http() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    if param.startswith("messages[1]"):
        assert "messages[1]" in error["message"]


def test_agents_sdk_runs_a_tool_loop(server: ServerProcess) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        seen.append(city)
        return f"It is sunny and 21 degrees in {city}."

    agent = Agent(
        name="weather",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(model="gpt-4o", openai_client=server.async_openai()),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=64
        ),
        # The 135M model would call the tool again every turn; the loop ends at its result.
        tool_use_behavior="stop_on_first_tool",
    )
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=3))
    assert len(seen) == 1 and isinstance(seen[0], str)
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item"]
    assert result.final_output == f"It is sunny and 21 degrees in {seen[0]}."


def test_a_client_leaving_a_forced_stream(server: ServerProcess) -> None:
    body = {"model": "met-tools", "messages": ASK, "tools": TOOLS, "tool_choice": "required"}
    body |= {"stream": True, "max_tokens": 200, "temperature": 1.0}
    with server.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as out:
        assert out.status_code == 200
        next(out.iter_lines())  # the first chunk, then the client goes away


def test_no_kv_block_is_left_behind(server: ServerProcess) -> None:
    deadline = time.monotonic() + 5
    with server.http() as http:
        while True:
            stats = http.get("/status").json()["stats"]
            if stats["kv_blocks_used"] == stats["running"] == stats["waiting"] == 0:
                break
            assert time.monotonic() < deadline, stats
            time.sleep(0.1)
        assert 'api="chat",code="200",finish="tool_calls"' in http.get("/metrics").text
