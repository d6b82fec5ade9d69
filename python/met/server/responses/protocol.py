"""Request bodies of the OpenAI Responses API (what Codex and the Agents SDK send)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from met.server.body import Body


class Part(Body):
    type: str
    text: str | None = None


class Item(Body):
    """One input item; which fields matter depends on `type` (the converter checks them, so an
    unknown type is a 400 that names it). A message may leave `type` out."""

    type: str | None = None
    id: str | None = None
    # message
    role: str | None = None
    content: str | list[Part] | None = None
    # function_call / custom_tool_call
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None
    arguments: str | None = None
    input: str | None = None
    # function_call_output / custom_tool_call_output
    output: str | list[Part] | None = None
    # reasoning
    summary: list[Part] | None = None


class Tool(Body):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    tools: list[Tool] | None = None  # namespace
    format: dict[str, Any] | None = None  # custom: {"type": "text"} or a grammar


class TextFormat(Body):
    type: str
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class Text(Body):
    format: TextFormat | None = None


class Reasoning(Body):
    effort: str | None = None
    summary: str | None = None


class ResponsesBody(Body):
    model: str | None = None
    input: str | list[Item] = ""
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = None
    top_p: float | None = None
    text: Text | None = None
    reasoning: Reasoning | None = None
    store: bool | None = None
    stream: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    # Accepted for compatibility; they change nothing here.
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    truncation: str | None = None
    user: str | None = None
