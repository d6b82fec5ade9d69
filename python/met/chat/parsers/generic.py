"""The generic format (llama.cpp's, for templates without tool support): the whole output is
one JSON object, {"tool_calls": [{"name", "arguments"}, ...]}, {"tool_call": {...}} or
{"response": "the answer"}. Each call of the list is reported as soon as its object closes, and
the answer streams as it is written (its JSON string decoded as far as it is complete), so a
reply cut short by max_tokens keeps what was complete."""

from __future__ import annotations

import json
import re

from met.chat.parsers.base import ParsedCall, ToolParser, json_value_end, log
from met.chat.parsers.hermes import call_from_object
from met.chat.parsers.jsonish import loads, value_end_after
from met.chat.types import ChatEvent, TextDelta

_ANSWER_OPEN = re.compile(r'\{\s*"response"\s*:\s*"')
_LIST_OPEN = re.compile(r'\{\s*"tool_calls"\s*:\s*\[')
_LIST_CLOSE = re.compile(r"\s*\]\s*\}")


class GenericParser(ToolParser):
    name = "generic"
    openers = ("{",)
    at_start_only = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._mode = "start"  # "answer" | "closing" | "list" | "done", once one is open
        self._rest = ""  # undecoded text of the open answer or list
        self._opener = ""  # the text that opened it

    def block_end(self, block: str) -> int | None:
        end = value_end_after(block, 0)
        return len(block) if end == -1 else end

    def parse_block(self, block: str) -> list[ParsedCall] | str | None:
        value = loads(block)
        if not isinstance(value, dict):
            return None
        if isinstance(value.get("response"), str) and len(value) == 1:
            return value["response"]
        items = value.get("tool_calls", [value["tool_call"]] if "tool_call" in value else None)
        if not isinstance(items, list) or not items:
            return None
        calls = [call_from_object(item) for item in items]
        return None if None in calls else calls  # type: ignore[return-value]

    def feed(self, text: str) -> list[ChatEvent]:
        if self._mode == "answer":
            return self._answer_text(text)
        if self._mode == "closing":
            return self._after(text)
        if self._mode == "list":
            return self._list_items(text)
        if self._mode == "start" and not self._only_content:
            start = (self._buf + text).lstrip()
            for mode, opener in (("answer", _ANSWER_OPEN), ("list", _LIST_OPEN)):
                opened = opener.match(start)
                if opened:
                    self._buf, self._mode, self._only_content = "", mode, True
                    self._opener = opened.group()
                    return self.feed(start[opened.end() :])
        return super().feed(text)

    def finish(self) -> list[ChatEvent]:
        rest, self._rest = self._rest, ""
        events: list[ChatEvent] = []
        if self._mode == "answer" and rest:  # cut short: what is left, as written
            events.append(TextDelta(rest))
        elif self._mode == "list" and rest.strip():
            if self.calls:
                log.warning("generic: a call cut short was dropped: %r", rest)
            elif self.forced:
                events += self.cut_call(rest)
            else:
                events.append(TextDelta(self._opener + rest))
        return events + super().finish()

    def _answer_text(self, text: str) -> list[ChatEvent]:
        pending = self._rest + text
        done, end = _string_prefix(pending)
        try:
            decoded = json.loads('"' + pending[:end] + '"')
        except ValueError:  # not JSON after all (unconstrained output): the text as written
            decoded = pending[:end]
        events: list[ChatEvent] = [TextDelta(decoded)] if decoded else []
        if not done:
            self._rest = pending[end:]
            return events
        self._rest, self._mode = "", "closing"
        return events + self._after(pending[end + 1 :])

    def _list_items(self, text: str) -> list[ChatEvent]:
        pending = self._rest + text
        events: list[ChatEvent] = []
        while True:
            body = pending.lstrip().removeprefix(",").lstrip()
            closed = _LIST_CLOSE.match(pending) if not body.startswith("{") else None
            if closed:
                self._rest, self._mode = "", "done"
                return events + super().feed(pending[closed.end() :])
            end = json_value_end(body, 0) if body.startswith("{") else None
            if end is None:
                self._rest = pending
                return events
            call = call_from_object(loads(body[:end]))
            if call is None:
                log.warning("generic: a call did not parse; returned as text: %r", body[:end])
                events.append(TextDelta(body[:end]))
            else:
                events += self._emit_calls([call])
            pending = body[end:]

    def _after(self, text: str) -> list[ChatEvent]:
        """After the answer's closing quote: its envelope's "}" is layout, the rest text."""
        text = text.lstrip()
        if not text:
            return []
        self._mode = "done"
        return super().feed(text[1:] if text.startswith("}") else text)


def _string_prefix(text: str) -> tuple[bool, int]:
    """(whether the JSON string body closes in `text`, length of its complete part)."""
    i = 0
    while i < len(text):
        c = text[i]
        if c == '"':
            return True, i
        if c == "\\":
            width = 6 if text[i + 1 : i + 2] == "u" else 2
            if text[i + 1 : i + 2] == "u" and 0xD800 <= _hex(text[i + 2 : i + 6]) < 0xDC00:
                width = 12  # a surrogate pair comes as two escapes
            if i + width > len(text):
                return False, i
            i += width
        else:
            i += 1
    return False, i


def _hex(digits: str) -> int:
    try:
        return int(digits, 16) if len(digits) == 4 else -1
    except ValueError:
        return -1
