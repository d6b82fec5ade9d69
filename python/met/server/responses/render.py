"""The pipeline's typed output events in the Responses API's shapes: SSE events and the body."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from met.chat.types import Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallStart, Usage
from met.server.responses.convert import ToolName

log = logging.getLogger("met.server")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(counts: Usage) -> dict[str, Any]:
    return {
        "input_tokens": counts.prompt_tokens,
        "input_tokens_details": {"cached_tokens": counts.cached_tokens},
        "output_tokens": counts.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": counts.reasoning_tokens},
        "total_tokens": counts.total_tokens,
    }


class ResponseRenderer:
    """Feeds events in; gives back the SSE frames to send and, at the end, the response.

    Output items are strictly sequential (reasoning, message, calls as the model wrote them);
    every frame carries the next sequence_number.
    """

    def __init__(self, envelope: dict[str, Any], names: dict[str, ToolName]) -> None:
        self.envelope = envelope  # the response object's fixed fields (id, model, echoes)
        self.names = names
        self.output: list[dict[str, Any]] = []
        self.status = "in_progress"
        self.incomplete_details: dict[str, str] | None = None
        self.error: dict[str, str] | None = None
        self.usage: dict[str, Any] | None = None
        self._sequence = 0
        self._open: str | None = None  # "reasoning" | "message" | "call:<index>"
        self._buffer: list[str] = []

    def response(self) -> dict[str, Any]:
        return {
            **self.envelope,
            "status": self.status,
            "error": self.error,
            "incomplete_details": self.incomplete_details,
            "output": self.output if self.status != "in_progress" else [],
            "usage": self.usage,
        }

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {payload}\n\n".encode()

    def start(self) -> list[bytes]:
        return [
            self._event("response.created", response=self.response()),
            self._event("response.in_progress", response=self.response()),
        ]

    def feed(self, event: Any) -> list[bytes]:
        if isinstance(event, TextDelta) and event.text:
            return self._text(event.text)
        if isinstance(event, ReasoningDelta) and event.text:
            return self._reasoning(event.text)
        if isinstance(event, ToolCallStart):
            return self._close() + self._call_start(event)
        if isinstance(event, ToolCallDelta) and self._open == f"call:{event.index}":
            self._buffer.append(event.arguments)
            item = self.output[-1]
            if item["type"] == "custom_tool_call" or not event.arguments:
                return []  # a freeform input is only known once its JSON envelope is whole
            item["arguments"] += event.arguments
            return [
                self._event(
                    "response.function_call_arguments.delta", **self._at(), delta=event.arguments
                )
            ]
        if isinstance(event, Finish) and event.reason == "length":
            self.incomplete_details = {"reason": "max_output_tokens"}
        return []

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.output[-1]["id"], "output_index": len(self.output) - 1}

    def _begin(self, kind: str, item: dict[str, Any]) -> list[bytes]:
        self._open = kind
        self.output.append(item)
        return [
            self._event("response.output_item.added", output_index=len(self.output) - 1, item=item)
        ]

    def _text(self, text: str) -> list[bytes]:
        frames: list[bytes] = []
        if self._open != "message":
            frames = self._close()
            item = {
                "id": new_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            frames += self._begin("message", item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            frames.append(
                self._event("response.content_part.added", **self._at(), content_index=0, part=part)
            )
            item["content"].append(dict(part))
        self.output[-1]["content"][0]["text"] += text
        return [
            *frames,
            self._event(
                "response.output_text.delta", **self._at(), content_index=0, delta=text, logprobs=[]
            ),
        ]

    def _reasoning(self, text: str) -> list[bytes]:
        frames: list[bytes] = []
        if self._open != "reasoning":
            frames = self._close()
            item = {
                "id": new_id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": ""}],
            }
            frames += self._begin("reasoning", item)
        self.output[-1]["content"][0]["text"] += text
        return [
            *frames,
            self._event("response.reasoning_text.delta", **self._at(), content_index=0, delta=text),
        ]

    def _call_start(self, event: ToolCallStart) -> list[bytes]:
        name = self.names.get(event.name, ToolName(event.name))
        item: dict[str, Any] = {
            "id": new_id("ctc" if name.custom else "fc"),
            "type": "custom_tool_call" if name.custom else "function_call",
            "status": "in_progress",
            "call_id": event.id,
            "name": name.name,
        }
        if name.namespace:
            item["namespace"] = name.namespace
        item["input" if name.custom else "arguments"] = ""
        self._buffer = []
        return self._begin(f"call:{event.index}", item)

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        item, at, frames = self.output[-1], self._at(), []
        if item["type"] == "message":
            part = item["content"][0]
            frames.append(
                self._event(
                    "response.output_text.done",
                    **at,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            )
            frames.append(
                self._event("response.content_part.done", **at, content_index=0, part=part)
            )
        elif item["type"] == "reasoning":
            text = item["content"][0]["text"]
            frames.append(
                self._event("response.reasoning_text.done", **at, content_index=0, text=text)
            )
        elif item["type"] == "custom_tool_call":
            item["input"] = _custom_input("".join(self._buffer))
            frames.append(
                self._event("response.custom_tool_call_input.delta", **at, delta=item["input"])
            )
            frames.append(
                self._event("response.custom_tool_call_input.done", **at, input=item["input"])
            )
        else:
            frames.append(
                self._event(
                    "response.function_call_arguments.done",
                    **at,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        item["status"] = "completed"
        self._open = None
        return [
            *frames,
            self._event("response.output_item.done", output_index=at["output_index"], item=item),
        ]

    def end(self, counts: Usage) -> list[bytes]:
        frames = self._close()
        self.usage = usage(counts)
        self.status = "incomplete" if self.incomplete_details else "completed"
        kind = "response.incomplete" if self.incomplete_details else "response.completed"
        return [*frames, self._event(kind, response=self.response())]

    def fail(self, code: str, message: str) -> list[bytes]:
        self.status = "failed"
        self.error = {"code": code, "message": message}
        return [self._event("response.failed", response=self.response())]


def _custom_input(arguments: str) -> str:
    # A freeform call reaches the template as a function with one string argument "input".
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        log.warning("a freeform tool call's arguments are not JSON; passing them as its input")
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return value["input"]
    return arguments
