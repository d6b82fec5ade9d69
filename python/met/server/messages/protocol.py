"""Request bodies of the Anthropic Messages API (what Claude Code and the anthropic SDK send)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from met.server.body import Body


class Block(Body):
    """One content block; which fields matter depends on `type` (checked by the converter, so
    an unknown type gets a 400 that names it)."""

    type: str
    text: str | None = None
    # tool_use
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    # tool_result
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None
    # thinking
    thinking: str | None = None


class Message(Body):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(Body):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent for client tools; server tools are refused


class ToolChoice(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Body):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)


class OutputFormat(Body):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Body):
    effort: str | None = None
    format: OutputFormat | None = None


class _Common(Body):
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None


class CountTokensBody(_Common):
    pass


class MessagesBody(_Common):
    max_tokens: int = Field(gt=0)
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = None
    metadata: dict[str, Any] | None = None
