"""The output parsers on fixtures, fed whole and streamed in 1-, 2- and 5-token chunks (and one
character at a time): the same content, reasoning and calls every way."""

from __future__ import annotations

import json
import re

import pytest

from met.chat.parsers import TOOL_PARSERS, ChoiceParser
from met.chat.parsers.reasoning import ReasoningSplitter
from met.chat.types import ChatResult, ToolCallDelta, ToolCallStart, ToolSpec

WEATHER = ToolSpec(
    "get_weather",
    "Weather of a city",
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
)
PARIS = json.dumps({"city": "Paris"})
TWO = json.dumps({"city": "Rome", "days": 2})

# A rough tokenizer: control markers whole, words, runs of spaces, single characters.
_TOKEN = re.compile(r"<\|?/?[\w=]+\|?>|\[[A-Z_]+\]|\w+|\s+|.", re.S)

# (format, output text, expected content, expected [(name, arguments)])
FIXTURES = [
    ("hermes", "Just text.", "Just text.", []),
    (
        "hermes",
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
        '"Paris"}}\n</tool_call>',
        "Let me look.",
        [("get_weather", PARIS)],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>',
        "",
        [("get_weather", PARIS), ("get_weather", TWO)],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
        "",
        [("get_weather", PARIS)],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        [],
    ),
    ("hermes", "<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
    (
        "hermes",
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
        "",
        [("get_weather", PARIS)],
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        "",
        [("get_weather", TWO)],
    ),
    (
        "qwen3_coder",
        "Sure. <tool_call>\n<function=get_weather>\n<parameter=city>\nParis",
        "Sure. <tool_call>\n<function=get_weather>\n<parameter=city>\nParis",
        [],
    ),
    ("llama3_json", "The weather is fine.", "The weather is fine.", []),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        [("get_weather", PARIS)],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_weather", "parameters": {"city": "Rome", "days": 2}}',
        "",
        [("get_weather", PARIS), ("get_weather", TWO)],
    ),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Par',
        '{"name": "get_weather", "parameters": {"city": "Par',
        [],
    ),
    ("llama3_json", '{"city": "Paris"}', '{"city": "Paris"}', []),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": "{\\"city\\": \\"Paris\\"}"}',
        "",
        [("get_weather", PARIS)],
    ),
    (
        "mistral",
        'I will check. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": '
        '"Paris"}}, {"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}]',
        "I will check.",
        [("get_weather", PARIS), ("get_weather", TWO)],
    ),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "", [("get_weather", PARIS)]),
    ("mistral", "[TOOL_CALLS][{oops}]", "[TOOL_CALLS][{oops}]", []),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city"',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city"',
        [],
    ),
    ("pythonic", "No tools needed.", "No tools needed.", []),
    (
        "pythonic",
        '[get_weather(city="Paris"), get_weather(city="Rome", days=2)]',
        "",
        [("get_weather", PARIS), ("get_weather", TWO)],
    ),
    (
        "pythonic",
        '<|python_start|>[get_weather(city="Paris")]<|python_end|>',
        "",
        [("get_weather", PARIS)],
    ),
    ("pythonic", '[get_weather(city="Par', '[get_weather(city="Par', []),
    ("pythonic", "[1] is a citation.", "[1] is a citation.", []),
    ("generic", '{"response": "Hello there"}', "Hello there", []),
    (
        "generic",
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}]}',
        "",
        [("get_weather", PARIS), ("get_weather", TWO)],
    ),
    (
        "generic",
        '{"tool_call": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}}',
        "",
        [("get_weather", PARIS)],
    ),
    (
        "generic",
        '{"tool_calls": [{"name": "get_weather", "arguments": {"ci',
        '{"tool_calls": [{"name": "get_weather", "arguments": {"ci',
        [],
    ),
    ("generic", "plain words", "plain words", []),
    (
        "generic",
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "ge',
        "",
        [("get_weather", PARIS)],
    ),
    (
        "hermes",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
        '<tool_call>{"name": "get_w',
        "",
        [("get_weather", PARIS)],
    ),
    (
        "generic",
        '{"response": "Hi \\"you\\"\\n\\u00e9 \\ud83d\\ude00!"}',
        'Hi "you"\n\u00e9 \U0001f600!',
        [],
    ),
    ("generic", '{"response": "cut sho', "cut sho", []),
    (
        "pythonic",
        '[get_weather(city="Paris", metric=true)]',
        "",
        [("get_weather", json.dumps({"city": "Paris", "metric": True}))],
    ),
]


def chunks(text: str, size: int) -> list[str]:
    if size == 0:
        return [text]
    if size < 0:
        return list(text)
    tokens = _TOKEN.findall(text)
    assert "".join(tokens) == text
    return ["".join(tokens[i : i + size]) for i in range(0, len(tokens), size)]


def run(parser: ChoiceParser, pieces: list[str]) -> ChatResult:
    result = ChatResult()
    for piece in pieces:
        for event in parser.feed(piece):
            result.add(event)
    for event in parser.finish():
        result.add(event)
    return result


@pytest.mark.parametrize("size", [0, 1, 2, 5, -1], ids=["whole", "1tok", "2tok", "5tok", "char"])
@pytest.mark.parametrize(("fmt", "text", "content", "calls"), FIXTURES)
def test_parser_fixture(fmt: str, text: str, content: str, calls: list, size: int) -> None:
    parser = ChoiceParser(TOOL_PARSERS[fmt]([WEATHER]))
    result = run(parser, chunks(text, size))
    assert result.content == content
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls
    assert all(len(c.id) >= 9 for c in result.tool_calls)
    assert len({c.id for c in result.tool_calls}) == len(calls)


# A forced call (tool_choice required / named) cut short by max_tokens: (format, output, calls).
CUT_FORCED = [
    (
        "generic",
        '{"tool_call": {"name": "get_weather", "arguments": {"city": "Par',
        [("get_weather", '{"city": "Par')],
    ),
    (
        "generic",
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}, '
        '{"name": "get_weather", "arguments": {"ci',
        [("get_weather", TWO)],  # after a complete call, the cut one is dropped
    ),
    (
        "generic",
        '{"tool_calls": [{"name": "get_weather", "arguments": {"ci',
        [("get_weather", '{"ci')],
    ),
    ("generic", '{"tool_call": {"na', []),
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}',
        [("get_weather", PARIS)],
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2",
        [("get_weather", PARIS)],
    ),
    ("qwen3_coder", "<tool_call>\n<function=get_wea", []),
]


@pytest.mark.parametrize("size", [0, 1, 5, -1], ids=["whole", "1tok", "5tok", "char"])
@pytest.mark.parametrize(("fmt", "text", "calls"), CUT_FORCED)
def test_a_forced_call_cut_short_is_the_call_it_began_never_content(
    fmt: str, text: str, calls: list, size: int
) -> None:
    parser = ChoiceParser(TOOL_PARSERS[fmt]([WEATHER], forced=True))
    result = run(parser, chunks(text, size))
    assert result.content == ""
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls


def test_call_start_comes_before_its_arguments_with_the_whole_name() -> None:
    parser = TOOL_PARSERS["hermes"]([WEATHER])
    events = []
    for piece in chunks(FIXTURES[2][1], 1):
        events += parser.feed(piece)
    events += parser.finish()
    kinds = [(type(e).__name__, e.index) for e in events]
    assert kinds == [
        ("ToolCallStart", 0),
        ("ToolCallDelta", 0),
        ("ToolCallStart", 1),
        ("ToolCallDelta", 1),
    ]
    assert isinstance(events[0], ToolCallStart) and events[0].name == "get_weather"
    assert isinstance(events[1], ToolCallDelta) and json.loads(events[1].arguments)


def test_at_most_one_call_when_parallel_calls_are_off() -> None:
    parser = ChoiceParser(TOOL_PARSERS["hermes"]([WEATHER], max_calls=1))
    result = run(parser, [FIXTURES[2][1]])
    assert [c.arguments for c in result.tool_calls] == [PARIS]


THINKING = [
    # (output, prompt opened the block, reasoning, content, calls)
    (
        "<think>\nThe user wants weather.\n</think>\n\nIt is sunny.",
        False,
        "\nThe user wants weather.\n",
        "It is sunny.",
        [],
    ),
    ("Reasoning here.</think>The answer.", True, "Reasoning here.", "The answer.", []),
    ("No thinking at all.", False, None, "No thinking at all.", []),
    ("<think>cut short by the limit", False, "cut short by the limit", "", []),
    (
        '<think>I should call it.</think>\n\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Paris"}}\n</tool_call>',
        False,
        "I should call it.",
        "",
        [("get_weather", PARIS)],
    ),
    ("<think>\n\n</think>\n\nDirect.", False, "\n\n", "Direct.", []),
    (
        "Later <think> tags </think> are text.",
        False,
        None,
        "Later <think> tags </think> are text.",
        [],
    ),
]


@pytest.mark.parametrize("size", [0, 1, 2, 5, -1], ids=["whole", "1tok", "2tok", "5tok", "char"])
@pytest.mark.parametrize(("text", "inside", "reasoning", "content", "calls"), THINKING)
def test_reasoning_split(
    text: str, inside: bool, reasoning: str | None, content: str, calls: list, size: int
) -> None:
    parser = ChoiceParser(TOOL_PARSERS["hermes"]([WEATHER]), ReasoningSplitter(inside))
    result = run(parser, chunks(text, size))
    assert (result.reasoning, result.content) == (reasoning, content)
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls
