"""gemma4 (Gemma 4): each call is its own block, `<|tool_call>call:NAME{key:value,...}<tool_call|>`,
values in Gemma's notation: strings between `<|"|>` markers, numbers, true/false/null, `{...}`
with bare keys and `[...]` (as the template writes arguments and llama.cpp's gemma4 parser reads
them). JSON's quoted strings and keys are read too: a forced call writes nested values as JSON."""

from __future__ import annotations

import json
import re

from met.chat.parsers.base import ParsedCall, ToolParser

CALL_OPEN, CALL_CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")
_NAME = re.compile(r"\s*call:([^{\s]+)\s*")
_WORDS = {"true": True, "false": False, "null": None}


class _SyntaxError(ValueError):
    pass


def block_end(text: str) -> int | None:
    """Index past the `<tool_call|>` that ends the block starting text, outside strings."""
    i, quoted = len(CALL_OPEN), False
    while i < len(text):
        if text.startswith(QUOTE, i):
            quoted, i = not quoted, i + len(QUOTE)
        elif not quoted and text.startswith(CALL_CLOSE, i):
            return i + len(CALL_CLOSE)
        else:
            i += 1
    return None


class _Reader:
    """Recursive descent over one call's value text."""

    def __init__(self, text: str) -> None:
        self.text, self.i = text, 0

    def skip(self) -> None:
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1

    def take(self, literal: str) -> bool:
        self.skip()
        if self.text.startswith(literal, self.i):
            self.i += len(literal)
            return True
        return False

    def value(self) -> object:
        self.skip()
        if self.take(QUOTE):
            end = self.text.find(QUOTE, self.i)
            if end < 0:
                raise _SyntaxError("open string")
            out, self.i = self.text[self.i : end], end + len(QUOTE)
            return out
        if self.text.startswith('"', self.i):
            decoded, self.i = json.JSONDecoder().raw_decode(self.text, self.i)
            return decoded
        if self.take("{"):
            return self.mapping()
        if self.take("["):
            return self.sequence()
        for word, meaning in _WORDS.items():
            if self.take(word):
                return meaning
        number = _NUMBER.match(self.text, self.i)
        if number is None:
            raise _SyntaxError(f"no value at {self.i}")
        self.i = number.end()
        return json.loads(number.group())

    def mapping(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.take("}"):
            return out
        while True:
            key = self.key()  # before the value: an assignment evaluates its right side first
            out[key] = self.value()
            if self.take("}"):
                return out
            if not self.take(","):
                raise _SyntaxError(f"no , or }} at {self.i}")

    def key(self) -> str:
        self.skip()
        if self.text.startswith((QUOTE, '"'), self.i):
            key = self.value()
        else:
            end = self.text.find(":", self.i)
            if end < 0:
                raise _SyntaxError("key without :")
            key, self.i = self.text[self.i : end].strip(), end
        if not isinstance(key, str) or not key or not self.take(":"):
            raise _SyntaxError(f"bad key at {self.i}")
        return key

    def sequence(self) -> list[object]:
        out: list[object] = []
        if self.take("]"):
            return out
        while True:
            out.append(self.value())
            if self.take("]"):
                return out
            if not self.take(","):
                raise _SyntaxError(f"no , or ] at {self.i}")


def parse_call(body: str) -> ParsedCall | None:
    """`call:NAME{...}` (what is between the markers) as a call, None when it does not parse."""
    head = _NAME.match(body)
    if head is None:
        return None
    reader = _Reader(body)
    reader.i = head.end()
    try:
        if not reader.take("{"):
            return None
        arguments = reader.mapping()
    except ValueError:  # _SyntaxError, or JSON that does not decode
        return None
    reader.skip()
    if reader.i != len(body):
        return None
    return ParsedCall(head.group(1), json.dumps(arguments, ensure_ascii=False))


class Gemma4Parser(ToolParser):
    name = "gemma4"
    openers = (CALL_OPEN,)

    def block_end(self, block: str) -> int | None:
        return block_end(block)

    def parse_block(self, block: str) -> list[ParsedCall] | None:
        body = block.removeprefix(CALL_OPEN).removesuffix(CALL_CLOSE)
        call = parse_call(body)
        return None if call is None else [call]
