"""The pipeline's typed output events in Anthropic's shapes: SSE frames and the message body."""

from __future__ import annotations

import json
import logging
from typing import Any

from met.chat.types import Finish, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallStart, Usage
from met.server.errors import APIError

log = logging.getLogger("met.server")

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

# Anthropic's error type for each status; a full queue is its "overloaded" 529.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_status_and_body(error: APIError) -> tuple[int, dict[str, Any]]:
    status = 529 if error.code == "queue_full" else error.status
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return status, {"type": "error", "error": {"type": kind, "message": error.message}}


def frame(event: str, data: dict[str, Any]) -> bytes:
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {payload}\n\n".encode()


def usage(counts: Usage) -> dict[str, int]:
    """Anthropic's split: input_tokens are the prompt tokens not read from the prefix cache
    (input_tokens + cache_read_input_tokens is the whole prompt, what count_tokens says)."""
    return {
        "input_tokens": counts.prompt_tokens - counts.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": counts.cached_tokens,
        "output_tokens": counts.completion_tokens,
    }


class MessageRenderer:
    """Feeds events in; gives back the frames to send and, at the end, the whole message.

    Blocks are strictly sequential: a new kind of output closes the open block first.
    """

    def __init__(self, message_id: str, model: str, prompt_tokens: int) -> None:
        self.message_id = message_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.content: list[dict[str, Any]] = []
        self._open: str | None = None  # "text" | "thinking" | "tool_use:<index>"
        self._arguments: list[str] = []
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None

    def _shell(self, content: list[dict[str, Any]], counts: Usage) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": usage(counts),
        }

    def start(self) -> list[bytes]:
        counts = Usage(self.prompt_tokens, 0)
        return [
            frame("message_start", {"type": "message_start", "message": self._shell([], counts)}),
            frame("ping", {"type": "ping"}),
        ]

    def feed(self, event: Any) -> list[bytes]:
        if isinstance(event, TextDelta):
            return self._delta("text", {"type": "text", "text": ""}, "text_delta", event.text)
        if isinstance(event, ReasoningDelta):
            block = {"type": "thinking", "thinking": "", "signature": ""}
            return self._delta("thinking", block, "thinking_delta", event.text)
        if isinstance(event, ToolCallStart):
            frames = self._close()
            block = {"type": "tool_use", "id": event.id, "name": event.name, "input": {}}
            return frames + self._begin(f"tool_use:{event.index}", block)
        if isinstance(event, ToolCallDelta):
            if self._open != f"tool_use:{event.index}" or not event.arguments:
                return []
            self._arguments.append(event.arguments)
            delta = {"type": "input_json_delta", "partial_json": event.arguments}
            return [self._delta_frame(delta)]
        if isinstance(event, Finish):
            self._finish(event)
        return []

    def _delta(self, kind: str, block: dict[str, Any], delta_type: str, text: str) -> list[bytes]:
        if not text:
            return []
        frames = []
        if self._open != kind:
            frames = self._close() + self._begin(kind, block)
        self.content[-1][kind] += text
        field = "text" if kind == "text" else "thinking"
        return [*frames, self._delta_frame({"type": delta_type, field: text})]

    def _delta_frame(self, delta: dict[str, Any]) -> bytes:
        index = len(self.content) - 1
        return frame(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )

    def _begin(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        self._open = kind
        self.content.append(dict(block))
        data = {
            "type": "content_block_start",
            "index": len(self.content) - 1,
            "content_block": block,
        }
        return [frame("content_block_start", data)]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        if self._open.startswith("tool_use"):
            self.content[-1]["input"] = _parse_input("".join(self._arguments))
            self._arguments = []
        self._open = None
        index = len(self.content) - 1
        return [frame("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _finish(self, event: Finish) -> None:
        if event.stop_sequence is not None:
            self.stop_reason, self.stop_sequence = "stop_sequence", event.stop_sequence
        else:
            self.stop_reason = _STOP_REASONS.get(event.reason, "end_turn")

    def end(self, counts: Usage) -> list[bytes]:
        frames = self._close()
        delta = {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence}
        message_delta = {"type": "message_delta", "delta": delta, "usage": usage(counts)}
        return [
            *frames,
            frame("message_delta", message_delta),
            frame("message_stop", {"type": "message_stop"}),
        ]

    def message(self, counts: Usage) -> dict[str, Any]:
        self._close()
        return self._shell(self.content, counts)


def _parse_input(arguments: str) -> dict[str, Any]:
    # The pipeline validates forced calls against the schema; a free-form call the parser
    # accepted is JSON too, but an object is what the API promises.
    try:
        value = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        log.warning("tool call arguments are not a JSON object; sent as input {}: %r", arguments)
        return {}
    return value
