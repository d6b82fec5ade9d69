"""An OpenAI Responses request onto the chat pipeline's ChatRequest (translation only)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from met.chat.types import ChatMessage, ChatRequest, ToolCall, ToolSpec, non_object_schema
from met.sampling import Constraint, SamplingParams
from met.server.errors import from_value_error, invalid
from met.server.responses.protocol import Item, Part, ResponsesBody, Tool

log = logging.getLogger("met.server")

# A namespace's functions reach the template as "<namespace>__<name>"; the map below turns a
# call back into its namespace and name.
NAMESPACE_SEPARATOR = "__"
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_CALLS = ("function_call", "custom_tool_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output")
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


@dataclass(frozen=True)
class ToolName:
    name: str
    namespace: str | None = None
    custom: bool = False  # a freeform tool: one string argument "input", a custom_tool_call


@dataclass
class Converted:
    request: ChatRequest
    names: dict[str, ToolName] = field(default_factory=dict)  # template name -> the API's
    history: list[ChatMessage] = field(default_factory=list)  # without instructions


def flat_name(name: str, namespace: str | None) -> str:
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def to_chat_request(body: ResponsesBody, previous: list[ChatMessage]) -> Converted:
    specs, names = tools(body.tools or [])
    items = [Item(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    history = [*previous, *input_messages(items)]
    _check_outputs_answer_calls(items, previous)
    if not any(m.role != "system" for m in history):
        raise invalid("input: at least one input item is required", "input")
    system = [ChatMessage("system", body.instructions)] if body.instructions else []
    choice = tool_choice(body.tool_choice)
    request = ChatRequest(
        messages=system + history,
        params=sampling_params(body),
        tools=specs,
        tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        reasoning_effort=body.reasoning.effort if body.reasoning else None,
    )
    return Converted(request, names, history)


def sampling_params(body: ResponsesBody) -> SamplingParams:
    params = SamplingParams(
        max_tokens=body.max_output_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
    )
    fmt = body.text.format if body.text else None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise invalid("text.format.schema: a JSON schema is required", "text.format.schema")
        params.constraint = Constraint("json_schema", fmt.schema_, "text.format")
    elif fmt is not None and fmt.type == "json_object":
        params.constraint = Constraint("json_object", None, "text.format")
    elif fmt is not None and fmt.type != "text":
        raise invalid(f"text.format.type: '{fmt.type}' is not supported", "text.format.type")
    try:
        params.validate()
    except ValueError as e:
        raise from_value_error(e) from None
    return params


def input_messages(items: list[Item]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    reasoning: list[str] = []  # a reasoning item belongs to the assistant turn after it
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.type or ("message" if item.role else None)
        if kind == "reasoning":
            reasoning += [p.text or "" for p in (item.summary or []) + _parts(item.content)]
        elif kind == "message":
            out.append(_message(item, where))
        elif kind in _CALLS:
            _turn(out).tool_calls.append(_call(item, where))
        elif kind in _OUTPUTS:
            if not item.call_id:
                raise invalid(f"{where}.call_id: required", f"{where}.call_id")
            out.append(ChatMessage("tool", _text(item.output, where), tool_call_id=item.call_id))
        else:
            raise invalid(
                f"{where}.type: input item type '{kind}' is not supported", f"{where}.type"
            )
        if reasoning and out and out[-1].role == "assistant":
            out[-1].reasoning = (out[-1].reasoning or "") + "".join(reasoning)
            reasoning = []
    return out


def _check_outputs_answer_calls(items: list[Item], previous: list[ChatMessage]) -> None:
    """As OpenAI: a tool output must answer a call in the input or the previous response."""
    calls = {call.id for message in previous for call in message.tool_calls}
    calls |= {item.call_id for item in items if item.type in _CALLS and item.call_id}
    for i, item in enumerate(items):
        if item.type in _OUTPUTS and item.call_id not in calls:
            raise invalid(
                f"input[{i}].call_id: No tool call found for {item.type} with call_id "
                f"'{item.call_id}' in the input or the previous response",
                f"input[{i}].call_id",
            )


def _turn(out: list[ChatMessage]) -> ChatMessage:
    """The assistant message a call belongs to: the one just before it, or a new one."""
    if not out or out[-1].role != "assistant":
        out.append(ChatMessage("assistant"))
    return out[-1]


def _call(item: Item, where: str) -> ToolCall:
    if not item.call_id or not item.name:
        raise invalid(f"{where}: a {item.type} item needs 'call_id' and 'name'", where)
    if item.type == "custom_tool_call":
        arguments = json.dumps({"input": item.input or ""}, ensure_ascii=False)
    else:
        arguments = item.arguments or "{}"
    return ToolCall(item.call_id, flat_name(item.name, item.namespace), arguments)


def _message(item: Item, where: str) -> ChatMessage:
    role = _ROLES.get(item.role or "")
    if role is None:
        raise invalid(f"{where}.role: '{item.role}' is not a message role", f"{where}.role")
    return ChatMessage(role, _text(item.content, where))


def _parts(content: str | list[Part] | None) -> list[Part]:
    return content if isinstance(content, list) else []


def _text(content: str | list[Part] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.type in ("input_image", "input_file", "input_audio"):
            raise invalid(
                f"{where}.content[{j}]: this model has no vision or audio; '{part.type}' parts "
                "are not supported",
                f"{where}.content[{j}]",
            )
        if part.type not in (*_TEXT_PARTS, "refusal"):
            raise invalid(f"{where}.content[{j}].type: '{part.type}' is not supported", where)
        texts.append(part.text or "")
    return "".join(texts)


def tools(tools: list[Tool]) -> tuple[list[ToolSpec], dict[str, ToolName]]:
    specs: list[ToolSpec] = []
    names: dict[str, ToolName] = {}

    def add(tool: Tool, namespace: str | None, where: str) -> None:
        if not tool.name:
            raise invalid(f"{where}.name: required", f"{where}.name")
        flat = flat_name(tool.name, namespace)
        custom = tool.type == "custom"
        names[flat] = ToolName(tool.name, namespace, custom)
        parameters = _custom_parameters(tool) if custom else tool.parameters
        schema = parameters or {"type": "object", "properties": {}}
        problem = non_object_schema(schema)
        if problem:
            raise invalid(
                f"{where}.parameters: invalid schema for {tool.name!r}: {problem}", "tools"
            )
        specs.append(ToolSpec(flat, tool.description, schema, bool(tool.strict)))

    for i, tool in enumerate(tools):
        if tool.type in ("function", "custom"):
            add(tool, None, f"tools[{i}]")
        elif tool.type == "namespace":
            for j, inner in enumerate(tool.tools or []):
                add(inner, tool.name, f"tools[{i}].tools[{j}]")
        else:
            log.info(
                "skipping the hosted tool '%s' (tools[%d]): met runs no hosted tools", tool.type, i
            )
    return specs, names


def _custom_parameters(tool: Tool) -> dict:
    # A freeform tool takes one string; its grammar, when given, is shown to the model.
    about = "The tool's whole input as one string."
    fmt = tool.format or {}
    if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        about += f" It follows this {fmt.get('syntax', '')} grammar:\n{fmt['definition']}"
    return {
        "type": "object",
        "properties": {"input": {"type": "string", "description": about}},
        "required": ["input"],
        "additionalProperties": False,
    }


def tool_choice(choice: str | dict | None) -> str | dict:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise invalid(
                f"tool_choice: '{choice}' is not one of auto, none, required", "tool_choice"
            )
        return choice
    kind = choice.get("type")
    if kind in ("function", "custom") and isinstance(choice.get("name"), str):
        return {"name": flat_name(choice["name"], choice.get("namespace"))}
    if kind == "allowed_tools" and choice.get("mode") in ("auto", "required"):
        return choice["mode"]
    raise invalid(f"tool_choice: type '{kind}' is not supported", "tool_choice")
