"""The API-neutral chat request every converter builds, and the typed output it gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from met.engine.outputs import TokenLogprob
from met.sampling import SamplingParams


@dataclass
class ToolSpec:
    name: str
    description: str | None
    parameters: dict  # JSON Schema (an empty object schema when none was given)
    strict: bool = False


def non_object_schema(schema: dict) -> str | None:
    """Why a tool's arguments schema is not an object schema (arguments are a JSON object, as
    OpenAI and Anthropic require), or None when it is one: a `type` other than "object"."""
    kind = schema.get("type", "object")
    if kind == "object":
        return None
    return f"the schema must be a JSON Schema of 'type: \"object\"', got 'type: {kind!r}'"


@dataclass
class ToolCall:
    id: str  # unique, >= 9 chars
    name: str
    arguments: str  # JSON text


@dataclass
class ChatMessage:
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    reasoning: str | None = None  # thinking text of an assistant turn in history
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None  # role == "tool"
    name: str | None = None  # tool name for role == "tool" when known


ToolChoice = str | dict  # "auto" | "none" | "required" | {"name": str}


@dataclass
class ChatRequest:
    messages: list[ChatMessage]
    params: SamplingParams  # includes params.constraint for response_format
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    enable_thinking: bool | None = None  # None: the template's default
    reasoning_effort: str | None = None
    max_thinking_tokens: int | None = None
    template_kwargs: dict = field(default_factory=dict)


# --- typed output events, per choice, in order ---


@dataclass
class TextDelta:
    text: str


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass
class ToolCallDelta:
    index: int
    arguments: str


@dataclass
class Finish:
    reason: str  # "stop" | "length" | "tool_calls" | "stop_sequence"
    stop_sequence: str | None = None


@dataclass
class Logprobs:
    """Token logprobs as they arrive (APIs that report them attach them to their own chunks)."""

    entries: list[TokenLogprob]


ChatEvent = TextDelta | ReasoningDelta | ToolCallStart | ToolCallDelta | Finish | Logprobs


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class ChatResult:
    """One choice's events accumulated (what a non-streaming response reports)."""

    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    stop_sequence: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def add(self, event: ChatEvent) -> None:
        if isinstance(event, TextDelta):
            self.content += event.text
        elif isinstance(event, ReasoningDelta):
            self.reasoning = (self.reasoning or "") + event.text
        elif isinstance(event, ToolCallStart):
            self.tool_calls.append(ToolCall(event.id, event.name, ""))
        elif isinstance(event, ToolCallDelta):
            self.tool_calls[event.index].arguments += event.arguments
        elif isinstance(event, Finish):
            self.finish_reason, self.stop_sequence = event.reason, event.stop_sequence
        elif isinstance(event, Logprobs):
            self.logprobs.extend(event.entries)
