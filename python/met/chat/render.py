"""Internal messages to the dicts chat templates read (Hugging Face conventions), and tools to
the generic format's system text for templates that cannot take them."""

from __future__ import annotations

import json
from typing import Any

from met.chat.types import ChatMessage, ToolSpec
from met.server.errors import invalid

GENERIC_TOOLS = "You can call these tools (JSON Schema of each one's arguments):\n{tools}\n\n"
GENERIC_CALL = (
    "To call tools, answer with only this JSON object:\n"
    '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}'
)
GENERIC_ANSWER = '\nTo answer without a tool, answer with only: {"response": "<your answer>"}'


def tool_dicts(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """Tools the way templates iterate them (OpenAI's shape, as transformers passes them)."""
    out = []
    for tool in tools:
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters}
        if tool.description is not None:
            function["description"] = tool.description
        out.append({"type": "function", "function": function})
    return out


def template_messages(messages: list[ChatMessage], generic: bool) -> list[dict[str, Any]]:
    """Template dicts. `generic`: the template has no tool support, so calls and results are
    written into plain turns in the generic format's JSON."""
    out = []
    for i, message in enumerate(messages):
        calls = [_call_dict(i, j, c) for j, c in enumerate(message.tool_calls)]
        if generic and message.role == "tool":
            response = {"tool_call_id": message.tool_call_id, "content": message.content}
            if message.name:
                response["name"] = message.name
            out.append({"role": "user", "content": json.dumps({"tool_response": response})})
            continue
        if generic and calls:
            envelope = [
                {
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"],
                    "id": c["id"],
                }
                for c in calls
            ]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": envelope})})
            continue
        entry: dict[str, Any] = {"role": message.role, "content": message.content}
        if calls:
            entry["tool_calls"] = calls
        if message.reasoning is not None:
            entry["reasoning_content"] = message.reasoning
        if message.role == "tool":
            entry["tool_call_id"] = message.tool_call_id
            if message.name:
                entry["name"] = message.name
        out.append(entry)
    return out


def _call_dict(i: int, j: int, call: Any) -> dict[str, Any]:
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        param = f"messages[{i}].tool_calls[{j}].function.arguments"
        raise invalid(f"{param}: is not valid JSON (message {i})", param=param) from None
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def generic_system_text(tools: list[ToolSpec], forced: bool) -> str:
    """The generic format's description of the tools and of its JSON envelope."""
    listed = "\n".join(
        json.dumps(
            {"name": t.name, "description": t.description or "", "parameters": t.parameters},
            ensure_ascii=False,
        )
        for t in tools
    )
    return GENERIC_TOOLS.format(tools=listed) + GENERIC_CALL + ("" if forced else GENERIC_ANSWER)


def with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """The text as (the start of) the system message."""
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{text}\n\n{messages[0]['content']}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
