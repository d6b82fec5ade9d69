"""An Anthropic Messages request onto the chat pipeline's ChatRequest (translation only)."""

from __future__ import annotations

import json
import logging
import re

from met.chat.types import ChatMessage, ChatRequest, ToolCall, ToolSpec, non_object_schema
from met.sampling import Constraint, SamplingParams
from met.server.errors import APIError, invalid
from met.server.messages.protocol import Block, Message, MessagesBody, Tool, ToolChoice, _Common

log = logging.getLogger("met.server")

# Claude Code starts its system prompt with a per-request attribution line
# ("x-anthropic-billing-header: cc_version=...; cc_entrypoint=...; cch=<nonce>;"). The nonce
# changes every request, so leaving it in would put a different token first in every prompt
# and defeat the prefix cache; it carries nothing for the model.
_ATTRIBUTION = re.compile(r"^[ \t]*x-anthropic-billing-header:[^\n]*(\n|$)", re.I | re.M)
_EMPTY_OBJECT = {"type": "object", "properties": {}}


def to_chat_request(body: _Common, params: SamplingParams) -> ChatRequest:
    """The internal request for `body`: the same one for /v1/messages and count_tokens."""
    messages = [ChatMessage("system", s) for s in [system_text(body.system)] if s]
    messages += _convert_messages(body.messages)
    choice, parallel = _tool_choice(body.tool_choice)
    request = ChatRequest(
        messages=messages,
        params=params,
        tools=_tools(body.tools or []),
        tool_choice=choice,
        parallel_tool_calls=parallel,
    )
    if body.output_config is not None:
        request.reasoning_effort = body.output_config.effort
    thinking = body.thinking
    if thinking is not None:
        request.enable_thinking = thinking.type != "disabled"
        if thinking.type == "enabled" and thinking.budget_tokens is not None:
            request.max_thinking_tokens = thinking.budget_tokens
    return request


def sampling_params(body: MessagesBody) -> SamplingParams:
    thinking = body.thinking
    budget = thinking.budget_tokens if thinking and thinking.type == "enabled" else None
    if budget is not None and body.max_tokens <= budget:
        # As Anthropic: the thinking is part of the answer, so its budget must leave room.
        raise invalid(
            f"max_tokens: must be greater than thinking.budget_tokens ({budget})", "max_tokens"
        )
    params = SamplingParams(
        max_tokens=body.max_tokens,
        temperature=_or(body.temperature, 1.0),
        top_p=_or(body.top_p, 1.0),
        top_k=_or(body.top_k, 0),
        stop=list(body.stop_sequences or []),
    )
    output = body.output_config
    if output is not None and output.format is not None:
        params.constraint = Constraint("json_schema", output.format.schema_, "output_config.format")
    if any(s == "" for s in params.stop):
        raise invalid("stop_sequences: stop sequences must not be empty", "stop_sequences")
    try:
        params.validate()
    except ValueError as e:
        raise invalid(str(e), str(e).partition(":")[0]) from None
    return params


def strip_attribution(text: str) -> str:
    return _ATTRIBUTION.sub("", text)


def system_text(system: str | list[Block] | None) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return strip_attribution(system)
    parts = []
    for i, block in enumerate(system):
        if block.type != "text" or block.text is None:
            raise invalid(f"system[{i}]: only text blocks are supported", f"system[{i}]")
        text = strip_attribution(block.text)
        if text.strip():
            parts.append(text)
    return "\n\n".join(parts)


def _convert_messages(messages: list[Message]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    calls: set[str] = set()  # the tool_use ids of the assistant turn before
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        _refuse_empty(message, where, i == len(messages) - 1)
        if isinstance(message.content, str):
            out.append(ChatMessage(message.role, message.content))
        elif message.role == "assistant":
            out.append(_assistant(message.content, where))
        else:
            out += _user(message.content, where, calls)
        if message.role == "assistant":
            # Anthropic joins consecutive messages of a role into one turn, so a run of
            # assistant messages is one turn whose calls the next user turn may answer.
            joined = i > 0 and messages[i - 1].role == "assistant"
            calls = (calls if joined else set()) | {c.id for c in out[-1].tool_calls}
    return out


def _refuse_empty(message: Message, where: str, last: bool) -> None:
    # Anthropic's two rules: a message has content unless it is the final assistant message
    # (an empty prefill), and a text block has text.
    if not message.content and not (last and message.role == "assistant"):
        raise invalid(
            f"{where}: all messages must have non-empty content except for the optional final "
            "assistant message",
            where,
        )
    for j, block in enumerate([] if isinstance(message.content, str) else message.content):
        if block.type == "text" and not block.text:
            at = f"{where}.content[{j}]"
            raise invalid(f"{at}: text content blocks must be non-empty", at)


def _assistant(blocks: list[Block], where: str) -> ChatMessage:
    out = ChatMessage("assistant")
    text, thinking = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.type == "text":
            text.append(block.text or "")
        elif block.type == "thinking":
            thinking.append(block.thinking or "")
        elif block.type == "redacted_thinking":
            continue  # encrypted by Anthropic; nothing a local model can read
        elif block.type == "tool_use":
            if not block.id or not block.name:
                raise invalid(f"{at}: a tool_use block needs 'id' and 'name'", at)
            arguments = json.dumps(block.input or {}, ensure_ascii=False)
            out.tool_calls.append(ToolCall(block.id, block.name, arguments))
        else:
            raise _unsupported_block(block, at)
    out.content = "".join(text)
    out.reasoning = "".join(thinking) or None
    return out


def _user(blocks: list[Block], where: str, calls: set[str]) -> list[ChatMessage]:
    # Tool results come first in a user turn (the API requires it); each becomes a tool message
    # and any text after them one user message. Each must answer one of `calls`, the previous
    # turn's tool_use blocks, as Anthropic requires: a result for no call is a client's bug
    # that the model would otherwise be shown as if it were history.
    out: list[ChatMessage] = []
    text: list[str] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.type == "text":
            text.append(block.text or "")
        elif block.type == "tool_result":
            if not block.tool_use_id:
                raise invalid(f"{at}.tool_use_id: required", f"{at}.tool_use_id")
            if block.tool_use_id not in calls:
                raise invalid(
                    f"{at}.tool_use_id: '{block.tool_use_id}' answers no tool_use block of the "
                    "previous assistant message; each tool_result must have one",
                    f"{at}.tool_use_id",
                )
            content = _result_text(block.content, at)
            if block.is_error:
                content = f"Error: {content}"
            out.append(ChatMessage("tool", content, tool_call_id=block.tool_use_id))
        else:
            raise _unsupported_block(block, at)
    if text or not out:
        out.append(ChatMessage("user", "".join(text)))
    return out


def _result_text(content: str | list[Block] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for k, block in enumerate(content):
        if block.type != "text":
            raise _unsupported_block(block, f"{where}.content[{k}]")
        parts.append(block.text or "")
    return "\n".join(parts)


def _unsupported_block(block: Block, where: str) -> APIError:
    if block.type in ("image", "document"):
        return invalid(
            f"{where}: this model has no vision; '{block.type}' blocks are not supported", where
        )
    return invalid(f"{where}: content block type '{block.type}' is not supported", where)


def _tools(tools: list[Tool]) -> list[ToolSpec]:
    specs = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            log.info(
                "skipping the server tool %r (%s): met runs client tools only", tool.name, tool.type
            )
            continue
        problem = non_object_schema(tool.input_schema or _EMPTY_OBJECT)
        if problem:
            where = f"tools[{i}].input_schema"
            raise invalid(f"{where}: invalid schema for {tool.name!r}: {problem}", "tools")
        specs.append(ToolSpec(tool.name, tool.description, tool.input_schema or _EMPTY_OBJECT))
    return specs


def _tool_choice(choice: ToolChoice | None) -> tuple[str | dict, bool]:
    if choice is None:
        return "auto", True
    parallel = not choice.disable_parallel_tool_use
    if choice.type == "tool":
        if not choice.name:
            raise invalid("tool_choice.name: required when type is 'tool'", "tool_choice.name")
        return {"name": choice.name}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def _or(value: float | int | None, default: float | int) -> float | int:
    return default if value is None else value
