"""OpenAI chat completion bodies onto met.chat's internal request (translation only: meaning
is checked once by met.chat.pipeline.prepare)."""

from __future__ import annotations

from typing import Any

from met.chat.types import ChatMessage, ChatRequest, ToolCall, ToolSpec, non_object_schema
from met.sampling import SamplingParams
from met.server.errors import invalid
from met.server.protocol import ChatCompletionBody
from met.server.protocol import ChatMessage as BodyMessage

_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
_EFFORTS = ("none", "minimal", "low", "medium", "high")


def chat_request(body: ChatCompletionBody, params: SamplingParams) -> ChatRequest:
    kwargs = dict(body.chat_template_kwargs or {})
    enable_thinking = kwargs.pop("enable_thinking", None)
    if enable_thinking is not None and not isinstance(enable_thinking, bool):
        raise invalid(
            "chat_template_kwargs.enable_thinking: must be a boolean", "chat_template_kwargs"
        )
    if body.reasoning_effort is not None and body.reasoning_effort not in _EFFORTS:
        raise invalid(f"reasoning_effort: must be one of {', '.join(_EFFORTS)}", "reasoning_effort")
    if body.max_thinking_tokens is not None and body.max_thinking_tokens < 0:
        raise invalid("max_thinking_tokens: must be non-negative", "max_thinking_tokens")
    return ChatRequest(
        messages=[internal_message(i, m) for i, m in enumerate(body.messages)],
        params=params,
        tools=[_tool(i, t) for i, t in enumerate(body.tools or [])],
        tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        enable_thinking=enable_thinking,
        reasoning_effort=body.reasoning_effort,
        max_thinking_tokens=body.max_thinking_tokens,
        template_kwargs=kwargs,
    )


def internal_message(i: int, message: BodyMessage) -> ChatMessage:
    content = message.content
    if isinstance(content, list):
        if any(part.type != "text" or part.text is None for part in content):
            raise invalid(
                f"messages[{i}].content: only text parts are supported", f"messages[{i}].content"
            )
        content = "".join(part.text or "" for part in content)
    role = "system" if message.role == "developer" else message.role
    calls = [
        ToolCall(call.id or f"call_{i}_{j}_history", call.function.name, call.function.arguments)
        for j, call in enumerate(message.tool_calls or [])
    ]
    if calls and role != "assistant":
        raise invalid(
            f"messages[{i}].tool_calls: only assistant messages carry tool calls",
            f"messages[{i}].tool_calls",
        )
    if role == "tool" and not message.tool_call_id:
        raise invalid(
            f"messages[{i}].tool_call_id: a tool message must name the call it answers",
            f"messages[{i}].tool_call_id",
        )
    return ChatMessage(
        role=role,
        content=content or "",
        reasoning=message.reasoning_content
        if message.reasoning_content is not None
        else message.reasoning,
        tool_calls=calls,
        tool_call_id=message.tool_call_id,
        name=message.name if role == "tool" else None,
    )


def _tool(i: int, raw: Any) -> ToolSpec:
    where = f"tools[{i}]"
    if not isinstance(raw, dict):
        raise invalid(f"{where}: must be an object", "tools")
    if raw.get("type") != "function":
        raise invalid(
            f"{where}.type: {raw.get('type')!r} is not supported; only 'function' is", "tools"
        )
    function = raw.get("function")
    if not isinstance(function, dict):
        raise invalid(f"{where}.function: must be an object", "tools")
    name, description = function.get("name"), function.get("description")
    parameters, strict = function.get("parameters", _EMPTY_SCHEMA), function.get("strict")
    if not isinstance(name, str):
        raise invalid(f"{where}.function.name: must be a string", "tools")
    if description is not None and not isinstance(description, str):
        raise invalid(f"{where}.function.description: must be a string", "tools")
    if not isinstance(parameters, dict):
        raise invalid(f"{where}.function.parameters: must be a JSON Schema object", "tools")
    problem = non_object_schema(parameters)
    if problem:
        raise invalid(
            f"{where}.function.parameters: invalid schema for {name!r}: {problem}", "tools"
        )
    if strict is not None and not isinstance(strict, bool):
        raise invalid(f"{where}.function.strict: must be a boolean", "tools")
    return ToolSpec(name, description, parameters, bool(strict))


def _tool_choice(raw: Any) -> str | dict:
    if raw is None:
        return "auto"
    if isinstance(raw, str):
        if raw not in ("none", "auto", "required"):
            raise invalid(
                f"tool_choice: {raw!r} is not one of 'none', 'auto' or 'required'", "tool_choice"
            )
        return raw
    function = raw.get("function") if isinstance(raw, dict) else None
    if not (
        isinstance(raw, dict)
        and raw.get("type") == "function"
        and isinstance(function, dict)
        and isinstance(function.get("name"), str)
    ):
        raise invalid(
            'tool_choice: must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    return {"name": function["name"]}
