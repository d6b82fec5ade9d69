"""hermes (Qwen2.5, Qwen3, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
and qwen3_coder (Qwen3-Coder): the same tags around `<function=NAME>` with one
`<parameter=KEY>value</parameter>` per argument."""

from __future__ import annotations

import json
import re

from met.chat.parsers.base import ParsedCall, ToolParser, arguments_text

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


def call_from_object(value: object) -> ParsedCall | None:
    """{"name": ..., "arguments"|"parameters": {...}} as a call, or None."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    raw = value.get("arguments", value.get("parameters", {}))
    arguments = arguments_text(raw)
    return None if arguments is None else ParsedCall(value["name"], arguments)


class _Tagged(ToolParser):
    openers = (TOOL_CALL_OPEN,)

    def block_end(self, block: str) -> int | None:
        at = block.find(TOOL_CALL_CLOSE)
        return None if at < 0 else at + len(TOOL_CALL_CLOSE)

    @staticmethod
    def body(block: str) -> str:
        return block[len(TOOL_CALL_OPEN) :].removesuffix(TOOL_CALL_CLOSE).strip()


class HermesParser(_Tagged):
    name = "hermes"

    def parse_block(self, block: str) -> list[ParsedCall] | None:
        try:
            value = json.loads(self.body(block))
        except ValueError:
            return None
        call = call_from_object(value)
        return None if call is None else [call]


_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_FUNCTION_OPEN = re.compile(r"<function=([^>\n]+)>")
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


class Qwen3CoderParser(_Tagged):
    name = "qwen3_coder"

    def parse_block(self, block: str) -> list[ParsedCall] | None:
        match = _FUNCTION.fullmatch(self.body(block))
        if match is None:
            return None
        return [self._call(match.group(1), match.group(2))]

    def partial_call(self, block: str) -> ParsedCall | None:
        """A call cut short: its name and the parameters it had closed."""
        head = _FUNCTION_OPEN.search(block)
        return None if head is None else self._call(head.group(1), block[head.end() :])

    def _call(self, name: str, parameters: str) -> ParsedCall:
        name = name.strip()
        spec = self.tools.get(name)
        properties = (spec.parameters.get("properties") or {}) if spec else {}
        arguments = {
            key.strip(): _typed(value, properties.get(key.strip()))
            for key, value in _PARAMETER.findall(parameters)
        }
        return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


def _typed(text: str, schema: object) -> object:
    """A parameter's text as the value its schema types it (strings stay text)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text
