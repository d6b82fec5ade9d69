"""`met serve` on a tiny random gpt-oss GGUF whose vocabulary is o200k_harmony, so prompts are
rendered and outputs parsed by openai-harmony (met.chat.harmony): the openai client (chat,
streamed, a forced tool call), the anthropic client (thinking + a forced tool_use) and a
Codex-shaped Responses request whose call comes back as a function_call item and whose
function_call_output continues the turn. A random model writes no harmony of its own, so the
calls are forced (the grammar writes harmony's syntax) and the plain answers checked for shape."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from gpt_oss_fixtures import gpt_oss_gguf, gpt_oss_model
from harmony_model import N_VOCAB, add_harmony_tokenizer
from hf_reference import Q
from server_harness import ServerProcess, start_server

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
}
FUNCTION = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("gpt_oss_harmony")
    model = gpt_oss_model(
        truncate=True, rounded=Q.MXFP4, vocab_size=N_VOCAB, max_position_embeddings=2048
    )
    path = gpt_oss_gguf(model, folder / "g.gguf", Q.MXFP4, Q.Q8_0, add_harmony_tokenizer)
    # A short server thinking budget: a random model's analysis ends there in a forced call.
    proc = start_server(
        "--model", str(path), "--served-model-name", "*", "--max-thinking-tokens", "6"
    )
    yield proc
    assert proc.stop() == 0


def _check_call(name: str, arguments: str) -> None:
    assert name == "get_weather"
    args = json.loads(arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 8


def test_chat_forced_tool_call_plain_and_streamed(server: ServerProcess) -> None:
    client = server.openai(timeout=120)
    reply = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[FUNCTION],
        tool_choice="required",
        max_tokens=64,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content in (None, "")
    [call] = choice.message.tool_calls
    # The server's 6-token budget ends the analysis: harmony's reasoning, in the chat shape.
    assert choice.message.model_extra["reasoning_content"]
    _check_call(call.function.name, call.function.arguments)
    stream = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[FUNCTION],
        tool_choice="required",
        max_tokens=64,
        temperature=0,
        stream=True,
    )
    name, arguments, finish = "", "", None
    for chunk in stream:
        for delta_call in chunk.choices[0].delta.tool_calls or []:
            name += delta_call.function.name or ""
            arguments += delta_call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, arguments, finish) == (call.function.name, call.function.arguments, "tool_calls")


def test_chat_answers_in_the_chat_shape(server: ServerProcess) -> None:
    client = server.openai(timeout=120)
    reply = client.chat.completions.create(
        model="m", messages=ASK, max_tokens=6, temperature=0, reasoning_effort="low"
    )
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    assert 1 <= reply.usage.completion_tokens <= 6


def test_the_thinking_budget_ends_the_analysis(server: ServerProcess) -> None:
    # The server's budget (6 tokens): the analysis is capped, then the answer's message begins.
    client = server.openai(timeout=120)
    reply = client.chat.completions.create(model="m", messages=ASK, max_tokens=24, temperature=0)
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"]
    # Six tokens of text and the <|end|> that closes the analysis message.
    assert 1 <= reply.usage.completion_tokens_details.reasoning_tokens <= 7


def test_messages_thinking_and_a_forced_tool_use(server: ServerProcess) -> None:
    claude = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)
    message = claude.messages.create(
        model="m",
        max_tokens=1200,
        thinking={"type": "enabled", "budget_tokens": 1024},
        tools=[{"name": "get_weather", "input_schema": WEATHER}],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=ASK,
        extra_body={"temperature": 0},
    )
    assert message.stop_reason == "tool_use"
    [use] = [b for b in message.content if b.type == "tool_use"]
    _check_call(use.name, json.dumps(use.input))
    # Greedy, the random model thinks to the budget: harmony's analysis, as a thinking block.
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    assert message.content[0].thinking


def test_responses_function_call_and_its_output_continue_the_turn(server: ServerProcess) -> None:
    client = server.openai(timeout=120)
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    first = client.responses.create(
        model="m",
        input=ASK,
        tools=tools,
        tool_choice="required",
        # Codex sends an effort; minimal's thinking budget (256 tokens) fits the output's.
        max_output_tokens=320,
        reasoning={"effort": "minimal"},
        temperature=0,
    )
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    [call] = [item for item in first.output if item.type == "function_call"]
    _check_call(call.name, call.arguments)
    follow = client.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}],
        tools=tools,
        max_output_tokens=4,
        temperature=0,
    )
    assert follow.status in ("completed", "incomplete") and follow.usage.output_tokens >= 1


LIST = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 6}}},
    "required": ["items"],
}


def test_response_format_shapes_the_final_message(server: ServerProcess) -> None:
    # The grammar writes the final channel's header and holds its text to the schema; the
    # random model's own answer would be neither.
    client = server.openai(timeout=120)
    reply = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "A shopping list, please."}],
        response_format={"type": "json_schema", "json_schema": {"name": "list", "schema": LIST}},
        max_tokens=200,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    answer = json.loads(choice.message.content)
    assert set(answer) == {"items"} and all(len(item) <= 6 for item in answer["items"])


def test_harmony_refuses_structured_output_it_cannot_place(server: ServerProcess) -> None:
    client = server.openai(timeout=120)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="m",
            messages=ASK,
            max_tokens=4,
            extra_body={"structured_outputs": {"regex": "a+"}},
        )
    assert e.value.status_code == 400 and e.value.param == "structured_outputs.regex"
    assert "only JSON" in e.value.message
