"""Gemma 4's chat: its tool-call syntax parsed into calls (met.chat.parsers.gemma4) fed whole,
split at every position and one character at a time; the template (gemma4_chat.TEMPLATE,
written to mirror the real one) detected as the gemma4 format and rendering system, tools, calls
and results; `met serve` on the tiny GGUF: chat streamed, a forced call and a tool result turn
through the openai and anthropic clients, generation ending at the template's turn ends."""

from __future__ import annotations

import json

import pytest
from gemma4_chat import SPECIALS, TEMPLATE, gemma4_chat_gguf
from server_harness import start_server

from met.chat.parsers import TOOL_PARSERS, ChoiceParser
from met.chat.parsers.reasoning import REASONING_TAGS, ReasoningSplitter
from met.chat.setup import detect_tool_format, resolve_setup
from met.chat.types import ChatResult, ToolSpec
from met.gguf_loader import open_gguf, read_config
from met.tokenizer import Tokenizer

WEATHER = ToolSpec(
    "get_weather",
    "Weather of a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)
PARIS = json.dumps({"city": "Paris"})
Q = '<|"|>'
FIXTURES = [
    ("Just text.", "Just text.", []),
    (
        f"Let me look.<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>",
        "Let me look.",
        [("get_weather", PARIS)],
    ),
    (
        f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>"
        f"<|tool_call>call:get_weather{{city:{Q}Rome{Q},days:2}}<tool_call|>",
        "",
        [("get_weather", PARIS), ("get_weather", json.dumps({"city": "Rome", "days": 2}))],
    ),
    (
        f"<|tool_call>call:plan{{stops:[{Q}a{Q}, {Q}b, c{Q}],opts:{{fast:true,n:-1.5e2}},"
        f"note:null}}<tool_call|>",
        "",
        [
            (
                "plan",
                json.dumps(
                    {"stops": ["a", "b, c"], "opts": {"fast": True, "n": -150.0}, "note": None}
                ),
            )
        ],
    ),
    (  # the closing marker and braces inside a string are text
        f"<|tool_call>call:get_weather{{city:{Q}}}{{<tool_call|>{Q}}}<tool_call|>",
        "",
        [("get_weather", json.dumps({"city": "}{<tool_call|>"}))],
    ),
    (  # JSON's quoted keys and strings, as a forced call's nested values are written
        '<|tool_call>call:get_weather{"city":"Paris"}<tool_call|>',
        "",
        [("get_weather", PARIS)],
    ),
    (
        "<|tool_call>call:get_weather{city:Paris}<tool_call|>",
        "<|tool_call>call:get_weather{city:Paris}<tool_call|>",
        [],
    ),
    (
        f"<|tool_call>call:get_weather{{city:{Q}Par",
        f"<|tool_call>call:get_weather{{city:{Q}Par",
        [],
    ),
]


def _pieces(text: str) -> list[list[str]]:
    """The text whole, split in two at every position, and one character at a time."""
    return [[text], *([text[:i], text[i:]] for i in range(1, len(text))), list(text)]


@pytest.mark.parametrize(("text", "content", "calls"), FIXTURES)
def test_gemma4_calls_parse_whole_and_split_anywhere(text: str, content: str, calls: list):
    for pieces in _pieces(text):
        parser, result = ChoiceParser(TOOL_PARSERS["gemma4"]([WEATHER])), ChatResult()
        for piece in pieces:
            for event in parser.feed(piece):
                result.add(event)
        for event in parser.finish():
            result.add(event)
        assert result.content == content, pieces
        assert [(c.name, c.arguments) for c in result.tool_calls] == calls, pieces


def test_the_template_is_the_gemma4_format():
    assert detect_tool_format(TEMPLATE) == "gemma4"
    setup = resolve_setup(TEMPLATE, None, None)
    assert (setup.tool_format, setup.reasoning) == ("gemma4", "gemma4")


def test_the_thought_channel_splits_off_whole_and_split_anywhere():
    call = f"<|tool_call>call:get_weather{{city:{Q}Oslo{Q}}}<tool_call|>"
    text = f"<|channel>thought\nThe user asks.<channel|>\n{call}"
    for pieces in _pieces(text):
        parser = ChoiceParser(
            TOOL_PARSERS["gemma4"]([WEATHER]), ReasoningSplitter(False, *REASONING_TAGS["gemma4"])
        )
        result = ChatResult()
        for event in [e for p in pieces for e in parser.feed(p)] + parser.finish():
            result.add(event)
        assert result.reasoning == "\nThe user asks." and result.content == "", pieces
        assert [(c.name, c.arguments) for c in result.tool_calls] == [
            ("get_weather", json.dumps({"city": "Oslo"}))
        ]


def test_the_template_renders_a_tool_round_and_turns_end_where_it_says(tmp_path):
    path = gemma4_chat_gguf(tmp_path / "g.gguf")
    tokenizer = Tokenizer.from_gguf(path)
    call = {"id": "c1", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
    ]
    text = tokenizer.apply_chat_template(history, tools=[TOOL])
    declaration = "<|tool>declaration:get_weather" + json.dumps(TOOL["function"], sort_keys=True)
    assert text == (
        f"<bos><|turn>system\nBe brief.{declaration}<tool|><turn|>\n"
        "<|turn>user\nWeather in Oslo?<turn|>\n<|turn>model\n"
        f"<|tool_call>call:get_weather{{city:{Q}Oslo{Q}}}<tool_call|>"
        f"<|tool_response>response:get_weather{{value:{Q}Sunny{Q}}}<tool_response|>"
    )
    assert tokenizer.apply_chat_template(ASK).endswith(
        "<|turn>model\n<|channel>thought\n<channel|>"
    )
    # A turn ends at <turn|>, a call's at <|tool_response>, where the template continues.
    ends = {SPECIALS.index("<turn|>"), SPECIALS.index("<|tool_response>")}
    assert ends <= set(read_config(open_gguf(path), path).eos_token_ids)


@pytest.mark.slow
def test_met_serve_gemma4_chat_and_tools_through_both_clients(tmp_path):
    path = gemma4_chat_gguf(tmp_path / "g.gguf")
    server = start_server("--model", str(path), "--served-model-name", "gemma4")
    try:
        _openai_turns(server.openai())
        _anthropic_turns(server)
    finally:
        assert server.stop() == 0


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER.parameters}}
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}]


def _openai_turns(client) -> None:
    reply = client.chat.completions.create(
        model="gemma4", messages=ASK, max_tokens=6, temperature=0
    )
    stream = client.chat.completions.create(
        model="gemma4", messages=ASK, max_tokens=6, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == reply.choices[0].message.content
    forced = client.chat.completions.create(
        model="gemma4",
        messages=ASK,
        max_tokens=60,
        temperature=0,
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = forced.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    thinking = client.chat.completions.create(
        model="gemma4",
        messages=ASK,
        max_tokens=80,
        temperature=0,
        tools=[TOOL],
        tool_choice="required",
        extra_body={"chat_template_kwargs": {"enable_thinking": True}, "max_thinking_tokens": 4},
    )
    message = thinking.choices[0].message
    assert message.tool_calls and message.model_extra.get("reasoning_content"), message
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 20 C"},
    ]
    after = client.chat.completions.create(
        model="gemma4", messages=history, max_tokens=4, temperature=0, tools=[TOOL]
    )
    assert after.usage.prompt_tokens > forced.usage.prompt_tokens
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")


def _anthropic_turns(server) -> None:
    import anthropic

    claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    tools = [{"name": "get_weather", "input_schema": WEATHER.parameters}]
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    with claude.messages.stream(
        model="gemma4", max_tokens=6, messages=ask, system="Be brief."
    ) as stream:
        text = "".join(stream.text_stream)
    assert text == stream.get_final_message().content[0].text
    forced = claude.messages.create(
        model="gemma4",
        max_tokens=60,
        messages=ask,
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert forced.stop_reason == "tool_use"
    use = next(b for b in forced.content if b.type == "tool_use")
    assert use.name == "get_weather" and "city" in use.input
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 20 C"}
    history = ask + [
        {"role": "assistant", "content": [use.model_dump()]},
        {"role": "user", "content": [result]},
    ]
    after = claude.messages.create(model="gemma4", max_tokens=4, messages=history, tools=tools)
    seen = after.usage.input_tokens + after.usage.cache_read_input_tokens
    assert seen > forced.usage.input_tokens + forced.usage.cache_read_input_tokens
