"""JSON mode (response_format {"type": "json_object"}): only tokens that keep the output a prefix
of one JSON object are drawn, and the end of text only once that object is complete.

JsonPrefix is a pushdown automaton over bytes (JSON's structure is ASCII; bytes >= 0x80 occur
only inside strings, so a token that splits a UTF-8 character is judged byte by byte like any
other). JsonConstraint follows one request's generated tokens and answers, for a candidate token,
whether the output may continue with it; the sampler asks it about candidates best first
(met.model.sampler), so a step usually checks a handful of tokens, not the vocabulary.

Runs of whitespace are capped (20 bytes, as llama.cpp's JSON grammar does): a model can
otherwise pad forever between values without ever breaking the grammar.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_WHITESPACE = frozenset(b" \t\n\r")
_MAX_WHITESPACE_RUN = 20
_LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')

# Modes: where the automaton stands between two bytes.
START = "start"  # before the top-level object: whitespace, then "{"
VALUE = "value"  # a value must come (after ":" or ",")
FIRST_ITEM = "first_item"  # right after "[": a value or "]"
FIRST_KEY = "first_key"  # right after "{": a key or "}"
KEY = "key"  # after "," in an object: a key
COLON = "colon"  # after a key
AFTER = "after"  # after a value: "," or the container's closing bracket
STRING = "string"
ESCAPE = "escape"  # after a backslash in a string
UNICODE = "unicode"  # inside \uXXXX
NUMBER = "number"
LITERAL = "literal"  # inside true / false / null
DONE = "done"  # the top-level object is closed: whitespace only

# Number sub-states that may end the number.
_NUMBER_ENDS = frozenset({"zero", "int", "frac", "exp"})


class JsonPrefix:
    """The state after some bytes of a JSON object; `feed` says whether more bytes keep it one."""

    __slots__ = ("mode", "stack", "key", "literal", "hex_left", "number", "spaces")

    def __init__(self) -> None:
        self.mode = START
        self.stack: list[str] = []  # "{" or "[" per open container
        self.key = False  # the open string is an object key
        self.literal = b""  # the rest of a true / false / null
        self.hex_left = 0  # hex digits still due in a \uXXXX escape
        self.number = ""  # number sub-state
        self.spaces = 0  # whitespace bytes in the current run

    def copy(self) -> JsonPrefix:
        other = JsonPrefix.__new__(JsonPrefix)
        other.mode, other.stack, other.key = self.mode, list(self.stack), self.key
        other.literal, other.hex_left = self.literal, self.hex_left
        other.number, other.spaces = self.number, self.spaces
        return other

    @property
    def complete(self) -> bool:
        return self.mode == DONE

    def feed(self, data: bytes) -> bool:
        """Advance over `data`; False as soon as a byte breaks the grammar (the state is then
        unusable: feed a copy when only asking)."""
        return all(self._byte(b) for b in data)

    def _byte(self, b: int) -> bool:
        mode = self.mode
        if mode == STRING:
            return self._string(b)
        if mode in (ESCAPE, UNICODE):
            return self._escape(b)
        if mode == NUMBER:
            if self._number(b):
                return True
            if self.number not in _NUMBER_ENDS:
                return False
            self._value_done()
            return self._byte(b)
        if mode == LITERAL:
            if b != self.literal[0]:
                return False
            self.literal = self.literal[1:]
            if not self.literal:
                self._value_done()
            return True
        if b in _WHITESPACE:
            self.spaces += 1
            return self.spaces <= _MAX_WHITESPACE_RUN
        self.spaces = 0
        return self._structural(b)

    def _structural(self, b: int) -> bool:
        mode = self.mode
        if mode == START:
            return b == ord("{") and self._open("{")
        if mode in (FIRST_KEY, KEY):
            if b == ord("}") and mode == FIRST_KEY:
                return self._close("{")
            if b == ord('"'):
                self.mode, self.key = STRING, True
                return True
            return False
        if mode == COLON:
            if b == ord(":"):
                self.mode = VALUE
                return True
            return False
        if mode in (VALUE, FIRST_ITEM):
            if b == ord("]") and mode == FIRST_ITEM:
                return self._close("[")
            return self._value_start(b)
        if mode == AFTER:
            top = self.stack[-1]
            if b == ord(","):
                self.mode = KEY if top == "{" else VALUE
                return True
            closing = ord("}") if top == "{" else ord("]")
            return b == closing and self._close(top)
        return False  # DONE: nothing but whitespace

    def _value_start(self, b: int) -> bool:
        if b in (ord("{"), ord("[")):
            return self._open(chr(b))
        if b == ord('"'):
            self.mode, self.key = STRING, False
            return True
        if b in _LITERALS:
            self.mode, self.literal = LITERAL, _LITERALS[b]
            return True
        if b == ord("-") or b in _DIGITS:
            self.mode = NUMBER
            self.number = "minus" if b == ord("-") else ("zero" if b == ord("0") else "int")
            return True
        return False

    def _string(self, b: int) -> bool:
        if b == ord('"'):
            if self.key:
                self.mode = COLON
            else:
                self._value_done()
            return True
        if b == ord("\\"):
            self.mode = ESCAPE
            return True
        return b >= 0x20  # control characters must be escaped

    def _escape(self, b: int) -> bool:
        if self.mode == ESCAPE:
            if b == ord("u"):
                self.mode, self.hex_left = UNICODE, 4
                return True
            self.mode = STRING
            return b in _ESCAPES
        if b not in _HEX:
            return False
        self.hex_left -= 1
        if self.hex_left == 0:
            self.mode = STRING
        return True

    def _number(self, b: int) -> bool:
        """Consumes b when it continues the number (False: b is not part of it)."""
        state, digit = self.number, b in _DIGITS
        if state == "minus":
            nxt = ("zero" if b == ord("0") else "int") if digit else None
        elif state == "zero":
            nxt = {ord("."): "dot", ord("e"): "e", ord("E"): "e"}.get(b)
        elif state in ("int", "frac"):
            nxt = state if digit else None
            if nxt is None and b in (ord("e"), ord("E")):
                nxt = "e"
            if nxt is None and b == ord(".") and state == "int":
                nxt = "dot"
        elif state == "dot":
            nxt = "frac" if digit else None
        elif state == "e":
            nxt = "exp" if digit else ("sign" if b in (ord("+"), ord("-")) else None)
        else:  # "sign" or "exp"
            nxt = "exp" if digit else None
        if nxt is None:
            return False
        self.number = nxt
        return True

    def _open(self, bracket: str) -> bool:
        self.stack.append(bracket)
        self.mode = FIRST_KEY if bracket == "{" else FIRST_ITEM
        return True

    def _close(self, bracket: str) -> bool:
        if not self.stack or self.stack[-1] != bracket:
            return False
        self.stack.pop()
        self._value_done()
        return True

    def _value_done(self) -> None:
        self.mode = AFTER if self.stack else DONE
        self.number = ""


class JsonConstraint:
    """One request's JSON-mode state over its generated tokens."""

    def __init__(
        self, token_bytes: Sequence[bytes], special_ids: Iterable[int], eos_ids: Iterable[int]
    ) -> None:
        self._token_bytes = token_bytes
        self._special = frozenset(special_ids)
        self._eos = frozenset(eos_ids)
        self._prefix = JsonPrefix()
        self._seen = 0  # generated tokens fed so far

    def sync(self, generated: Sequence[int]) -> None:
        """Feeds the generated tokens not seen yet (the output only ever grows)."""
        for token in generated[self._seen :]:
            if token not in self._eos:
                self._prefix.feed(self._bytes(token))
        self._seen = len(generated)

    def allows(self, token: int) -> bool:
        if token in self._eos:
            return self._prefix.complete
        if token in self._special or token >= len(self._token_bytes):
            return False
        data = self._bytes(token)
        return bool(data) and self._prefix.copy().feed(data)

    def _bytes(self, token: int) -> bytes:
        return self._token_bytes[token] if token < len(self._token_bytes) else b""
