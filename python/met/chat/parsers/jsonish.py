"""Formats whose calls are bare JSON: llama3_json (Llama 3.1-3.3) and mistral (`[TOOL_CALLS]`)."""

from __future__ import annotations

import json

from met.chat.parsers.base import ParsedCall, ToolParser, arguments_text, json_value_end
from met.chat.parsers.hermes import call_from_object

PYTHON_TAG = "<|python_tag|>"
TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"


def loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def value_end_after(block: str, start: int) -> int | None:
    """End of the JSON object/array that begins (after whitespace) at block[start:]."""
    i = start
    while i < len(block) and block[i].isspace():
        i += 1
    if i == len(block):
        return None
    return json_value_end(block, i) if block[i] in "{[" else -1


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    openers = (PYTHON_TAG, "{")
    at_start_only = True

    def lead(self, text: str) -> str:
        text = text.lstrip()
        if self.calls:  # further calls follow a ';'
            text = text.removeprefix(";").lstrip()
        return text

    def block_end(self, block: str) -> int | None:
        start = len(PYTHON_TAG) if block.startswith(PYTHON_TAG) else 0
        end = value_end_after(block, start)
        return len(block) if end == -1 else end

    def parse_block(self, block: str) -> list[ParsedCall] | None:
        call = call_from_object(loads(block.removeprefix(PYTHON_TAG).strip()))
        return None if call is None else [call]


class MistralParser(ToolParser):
    """`[TOOL_CALLS][{"name", "arguments"}, ...]`, or v11's `[TOOL_CALLS]name[ARGS]{...}`."""

    name = "mistral"
    openers = (TOOL_CALLS,)

    def block_end(self, block: str) -> int | None:
        rest = block[len(TOOL_CALLS) :]
        if rest.lstrip()[:1] in ("[", "{"):
            end = value_end_after(block, len(TOOL_CALLS))
        else:
            at = block.find(ARGS)
            if at < 0:
                return None
            end = value_end_after(block, at + len(ARGS))
        return len(block) if end == -1 else end

    def parse_block(self, block: str) -> list[ParsedCall] | None:
        rest = block[len(TOOL_CALLS) :].strip()
        if rest[:1] in ("[", "{"):
            value = loads(rest)
            items = value if isinstance(value, list) else [value]
            calls = [call_from_object(item) for item in items]
            return None if not calls or None in calls else calls  # type: ignore[return-value]
        name, _, raw = rest.partition(ARGS)
        arguments = arguments_text(raw.strip())
        if not name.strip() or arguments is None:
            return None
        return [ParsedCall(name.strip(), arguments)]
