"""Request bodies of the Anthropic Messages API (what Claude Code and the anthropic SDK send)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    # As met.server.protocol: strict types, unknown fields (cache_control, ...) ignored.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class Block(_Body):
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


class Message(_Body):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(_Body):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent for client tools; server tools are refused


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Body):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class OutputFormat(_Body):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Body):
    effort: str | None = None
    format: OutputFormat | None = None


class _Common(_Body):
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
