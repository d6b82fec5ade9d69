"""The shape every output parser shares: text in, typed events out, the same whole or chunked.

A tool parser passes content through as it comes and holds back only what could still turn out
to be the start of a call (a suffix that is a prefix of an opener, and trailing whitespace, which
is dropped when it only surrounds calls). A call is reported once its block is complete and
parses: the start (id and whole name) and then its arguments, so a block that does not parse can
still be returned as the text it was (logged), never half a call. A forced call (tool_choice
required or a named function) cut short by a limit is the exception: the grammar made the
output a call, so when it is the first it is reported as the call it had begun (its whole name and
the arguments written so far, as OpenAI returns a call cut by max_tokens), or dropped while it
has no name yet; never as content. After complete calls, a call cut short is dropped (logged).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from dataclasses import dataclass

from met.chat.types import ChatEvent, TextDelta, ToolCallDelta, ToolCallStart, ToolSpec

log = logging.getLogger("met.chat")


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text


def partial_prefix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    best = 0
    for marker in markers:
        for keep in range(min(len(marker) - 1, len(text)), best, -1):
            if marker.startswith(text[-keep:]):
                best = keep
                break
    return best


def arguments_text(value: object) -> str | None:
    """Arguments as JSON object text; a JSON string holding an object (encoded twice) is
    decoded once. None when they are not an object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)


_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGUMENTS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


def partial_json_call(text: str) -> ParsedCall | None:
    """The call a JSON call object cut short had begun (in any wrapper): its name once that is
    complete, and the text of its arguments so far (up to their end, if they are complete)."""
    name = _NAME.search(text)
    if name is None:
        return None
    start = _ARGUMENTS.search(text, name.end())
    arguments = text[start.end() :] if start else ""
    end = json_value_end(arguments, 0) if arguments.startswith("{") else None
    return ParsedCall(json.loads(f'"{name.group(1)}"'), arguments[:end].rstrip())


def json_value_end(text: str, start: int) -> int | None:
    """Index just past the JSON object/array opening at text[start], or None while it is open."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


class ToolParser:
    """Base of the per-format parsers; subclasses say where blocks open, end and what they hold."""

    name = "none"
    openers: tuple[str, ...] = ()
    # Formats whose calls are the whole output (bare JSON, a Python list): a call can only
    # open where the output (or the text after the previous call) begins.
    at_start_only = False

    def __init__(
        self,
        tools: list[ToolSpec] | None = None,
        max_calls: int | None = None,
        forced: bool = False,
    ) -> None:
        self.tools = {t.name: t for t in tools or []}
        self.max_calls = max_calls
        self.forced = forced  # the grammar made the output calls (tool_choice required / named)
        self.calls = 0
        self._buf = ""
        self._in_block = False
        self._only_content = False  # at_start_only formats: the output began as plain text
        self._gap = ""  # whitespace between the content and the open block

    # --- what a format defines ---
    def block_end(self, block: str) -> int | None:
        """Where the block at the start of `block` (it begins with an opener) ends, if yet."""
        raise NotImplementedError

    def parse_block(self, block: str) -> list[ParsedCall] | str | None:
        """The calls in one complete block, or the content it wraps (the generic format's
        response); None when it does not parse."""
        raise NotImplementedError

    def opener_at(self, text: str) -> int | None:
        """Where the first opener starts in `text` (at_start_only: only at its start)."""
        if self.at_start_only:
            stripped = self.lead(text)
            start = len(text) - len(stripped)
            return start if stripped.startswith(self.openers) else None
        found = [i for i in (text.find(o) for o in self.openers) if i >= 0]
        return min(found) if found else None

    def partial_call(self, block: str) -> ParsedCall | None:
        """The call a block cut short had begun (formats whose calls are JSON objects)."""
        return partial_json_call(block)

    def lead(self, text: str) -> str:
        """`text` without the layout that may come before a call (at_start_only formats)."""
        return text.lstrip()

    # --- the shared machinery ---
    def feed(self, text: str) -> list[ChatEvent]:
        self._buf += text
        events: list[ChatEvent] = []
        while self._buf:
            if not self._in_block and not self._open_block(events):
                break
            end = self.block_end(self._buf)
            if end is None:
                break
            block, self._buf = self._buf[:end], self._buf[end:]
            self._in_block = False
            events += self._block_events(block)
        return events

    def finish(self) -> list[ChatEvent]:
        events: list[ChatEvent] = []
        if self._in_block:  # cut short (end of text or a limit): parse it as it stands
            block, self._buf = self._buf, ""
            self._in_block = False
            if self.calls and self.parse_block(block) is None:
                # After complete calls, a call cut short is the limit's doing, not an answer.
                log.warning("%s: a call cut short was dropped: %r", self.name, block)
            elif self.forced and self.parse_block(block) is None:
                events += self.cut_call(block)
            else:
                events += self._block_events(block)
        rest, self._buf = self._buf, ""
        if rest and not (self.calls and not rest.strip()):
            events.append(TextDelta(rest))
        return events

    def cut_call(self, text: str) -> list[ChatEvent]:
        """A forced call cut short: the call it had begun, or nothing while it has no name."""
        call = self.partial_call(text)
        if call is None:
            log.warning(
                "%s: a forced call cut short before its name was dropped: %r", self.name, text
            )
            return []
        return self._emit_calls([call])

    def _open_block(self, events: list[ChatEvent]) -> bool:
        """Emit the content before the next opener; True when a block now starts the buffer."""
        buf = self._buf
        at = None if self._only_content or not self.openers else self.opener_at(buf)
        if at is not None:
            before = "" if self.at_start_only else buf[:at].rstrip()
            self._emit(before, events)
            # Whitespace before a call is layout; kept in case the block turns out to be text.
            self._gap = buf[len(before) : at]
            self._buf, self._in_block = buf[at:], True
            return True
        if self.at_start_only and not self._only_content:
            stripped = self.lead(buf)
            if not stripped or any(o.startswith(stripped) for o in self.openers):
                return False  # may still become a call
            self._only_content = True
        hold = 0 if self._only_content else partial_prefix(buf, self.openers)
        head = buf[: len(buf) - hold]
        hold += len(head) - len(head.rstrip())
        self._emit(buf[: len(buf) - hold], events)
        self._buf = buf[len(buf) - hold :]
        return False

    @staticmethod
    def _emit(text: str, events: list[ChatEvent]) -> None:
        if text:
            events.append(TextDelta(text))

    def _block_events(self, block: str) -> list[ChatEvent]:
        calls = self.parse_block(block)
        if calls is None:
            log.warning("%s: a tool call did not parse; returned as text: %r", self.name, block)
            self._only_content = self._only_content or self.at_start_only
            return [TextDelta(self._gap + block)]
        if isinstance(calls, str):
            self._only_content = self._only_content or self.at_start_only
            return [TextDelta(calls)] if calls else []
        return self._emit_calls(calls)

    def _emit_calls(self, calls: list[ParsedCall]) -> list[ChatEvent]:
        """Start and arguments of each call, numbered on from the calls before."""
        events: list[ChatEvent] = []
        for call in calls:
            if self.max_calls is not None and self.calls >= self.max_calls:
                log.warning(
                    "%s: call to %s beyond parallel_tool_calls=false dropped", self.name, call.name
                )
                continue
            index = self.calls
            self.calls += 1
            events += [
                ToolCallStart(index, new_call_id(), call.name),
                ToolCallDelta(index, call.arguments),
            ]
        return events


class NoTools(ToolParser):
    """Everything is content (tool_choice none, or a request without tools)."""

    def feed(self, text: str) -> list[ChatEvent]:
        return [TextDelta(text)] if text else []

    def finish(self) -> list[ChatEvent]:
        return []
