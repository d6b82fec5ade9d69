"""Structured output: only tokens that keep the output a prefix of a JSON value matching the
request's schema are drawn (response_format json_object: any object; json_schema: the compiled
schema of met.model.json_schema), and the end of text only once that value is complete.

JsonPrefix is a pushdown automaton over bytes (JSON's structure is ASCII; bytes >= 0x80 occur
only inside strings, so a token that splits a UTF-8 character is judged byte by byte like any
other). A schema with alternatives (anyOf, a list of types) keeps one stack per alternative still
alive. JsonConstraint follows one request's generated tokens and answers, for a candidate token,
whether the output may continue with it; the sampler asks about candidates best first
(met.model.sampler), so a step usually checks a handful of tokens, not the vocabulary.

Whitespace between tokens is kept to what JSON writers produce (as llama.cpp's JSON grammar
does): at most one line break and 20 bytes in a run. A model can otherwise pad forever between
values (a blank line after every brace) without ever breaking the grammar.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from met.model.json_schema import ANY, ANY_OBJECT, Node

_WHITESPACE = frozenset(b" \t\n\r")
_MAX_WHITESPACE_RUN = 20
_LINE_BREAKS = frozenset(b"\r\n")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')
_ANY_KEY = Node("string")

# What Frame.feed answers: the byte was consumed; it breaks the grammar; it completed the frame
# (consumed, or not and to be fed to the parent); or it starts a value of a node (not consumed).
OK, FAIL, DONE, DONE_AGAIN, VALUE = range(5)


class Frame:
    """One open value on the stack. `between` frames accept whitespace before their next byte."""

    between = False

    def copy(self) -> Frame:
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        return other

    def feed(self, b: int) -> tuple[int, Node | None]:
        raise NotImplementedError

    def child_done(self, child: Frame) -> None:
        raise NotImplementedError


class RootFrame(Frame):
    def __init__(self, node: Node) -> None:
        self.node, self.done = node, False
        self.spaces, self.breaks = 0, 0  # the current whitespace run: bytes, line breaks

    @property
    def between(self) -> bool:
        return True

    def feed(self, b: int) -> tuple[int, Node | None]:
        return (FAIL, None) if self.done else (VALUE, self.node)

    def child_done(self, child: Frame) -> None:
        self.done = True


class ObjectFrame(Frame):
    def __init__(self, node: Node) -> None:
        self.node, self.mode, self.seen, self.key = node, "open", frozenset(), b""

    @property
    def between(self) -> bool:
        return self.mode in ("first", "key", "colon", "value", "after")

    def _more_keys(self) -> bool:
        return self.node.extra is not None or bool(set(self.node.props) - self.seen)

    def _key_node(self) -> Node:
        if self.node.extra is not None:
            return _ANY_KEY  # any key; a declared one gets its own schema when it is complete
        return Node("string", enum=frozenset(set(self.node.props) - self.seen))

    def feed(self, b: int) -> tuple[int, Node | None]:
        mode = self.mode
        if mode == "open":
            self.mode = "first"
            return (OK, None) if b == ord("{") else (FAIL, None)
        if mode in ("first", "key"):
            if b == ord("}") and mode == "first" and self.node.required <= self.seen:
                return DONE, None
            if b == ord('"') and self._more_keys():
                self.mode = "in_key"
                return VALUE, self._key_node()
            return FAIL, None
        if mode == "colon":
            self.mode = "value" if b == ord(":") else mode
            return (OK, None) if b == ord(":") else (FAIL, None)
        if mode == "value":
            self.mode = "in_value"
            return VALUE, self.node.props.get(self.key, self.node.extra)
        if mode == "dead":
            return FAIL, None
        if b == ord(",") and self._more_keys():  # mode "after"
            self.mode = "key"
            return OK, None
        done = b == ord("}") and self.node.required <= self.seen
        return (DONE, None) if done else (FAIL, None)

    def child_done(self, child: Frame) -> None:
        if self.mode == "in_key":
            key = bytes(child.body)
            if key in self.seen or (key not in self.node.props and self.node.extra is None):
                self.mode = "dead"  # a repeated or undeclared key: nothing can follow
                return
            self.key, self.seen, self.mode = key, self.seen | {key}, "colon"
        else:
            self.mode = "after"


class ArrayFrame(Frame):
    def __init__(self, node: Node) -> None:
        self.node, self.mode, self.count = node, "open", 0

    @property
    def between(self) -> bool:
        return self.mode in ("first", "value", "after")

    def feed(self, b: int) -> tuple[int, Node | None]:
        mode, node = self.mode, self.node
        room = node.max_items is None or self.count < node.max_items
        if mode == "open":
            self.mode = "first"
            return (OK, None) if b == ord("[") else (FAIL, None)
        if b == ord("]") and mode in ("first", "after") and self.count >= node.min_items:
            return DONE, None
        if mode == "after":
            self.mode = "value" if b == ord(",") and room else "after"
            return (OK, None) if self.mode == "value" else (FAIL, None)
        if not room:
            return FAIL, None
        self.mode = "in_value"
        return VALUE, node.items

    def child_done(self, child: Frame) -> None:
        self.mode, self.count = "after", self.count + 1


class StringFrame(Frame):
    def __init__(self, node: Node) -> None:
        self.enum, self.mode, self.body, self.hex_left = node.enum, "open", b"", 0

    def feed(self, b: int) -> tuple[int, Node | None]:
        mode = self.mode
        if mode == "open":
            self.mode = "text"
            return (OK, None) if b == ord('"') else (FAIL, None)
        if mode == "text" and b == ord('"'):
            done = self.enum is None or self.body in self.enum
            return (DONE, None) if done else (FAIL, None)
        if mode == "text":
            ok = b >= 0x20  # control characters must be escaped
            self.mode = "escape" if b == ord("\\") else mode
        elif mode == "escape":
            ok = b in _ESCAPES or b == ord("u")
            self.mode, self.hex_left = ("hex", 4) if b == ord("u") else ("text", 0)
        else:  # "hex"
            ok = b in _HEX
            self.hex_left -= 1
            self.mode = "text" if self.hex_left == 0 else mode
        self.body += bytes([b])
        if ok and self.enum is not None:
            ok = any(value.startswith(self.body) for value in self.enum)
        return (OK, None) if ok else (FAIL, None)


class NumberFrame(Frame):
    """A JSON number (an integer one refuses fraction and exponent); it ends at the first byte
    that cannot continue it, which then goes to the parent."""

    _ENDS = frozenset({"zero", "int", "frac", "exp"})

    def __init__(self, node: Node) -> None:
        self.integer, self.state = node.kind == "integer", "open"

    def feed(self, b: int) -> tuple[int, Node | None]:
        nxt = self._next(b)
        if nxt is not None:
            self.state = nxt
            return OK, None
        return (DONE_AGAIN, None) if self.state in self._ENDS else (FAIL, None)

    def _next(self, b: int) -> str | None:
        state, digit = self.state, b in _DIGITS
        if state in ("open", "minus"):
            if digit:
                return "zero" if b == ord("0") else "int"
            return "minus" if state == "open" and b == ord("-") else None
        if state in ("int", "frac", "exp", "sign") and digit:
            return "exp" if state == "sign" else state
        if self.integer:
            return None
        if state in ("zero", "int") and b == ord("."):
            return "dot"
        if state == "dot":
            return "frac" if digit else None
        if state in ("zero", "int", "frac") and b in (ord("e"), ord("E")):
            return "e"
        if state == "e":
            return "exp" if digit else ("sign" if b in (ord("+"), ord("-")) else None)
        return None


class LiteralFrame(Frame):
    def __init__(self, node: Node) -> None:
        self.rest = node.literal

    def feed(self, b: int) -> tuple[int, Node | None]:
        if not self.rest or b != self.rest[0]:
            return FAIL, None
        self.rest = self.rest[1:]
        return (OK, None) if self.rest else (DONE, None)


_FRAMES = {
    "object": ObjectFrame,
    "array": ArrayFrame,
    "string": StringFrame,
    "number": NumberFrame,
    "integer": NumberFrame,
    "literal": LiteralFrame,
}
# The value kinds of an unconstrained value, by first byte.
_ANY_BY_BYTE = {
    ord("{"): [Node("object", extra=ANY)],
    ord("["): [Node("array", items=ANY)],
    ord('"'): [Node("string")],
    ord("t"): [Node("literal", literal=b"true")],
    ord("f"): [Node("literal", literal=b"false")],
    ord("n"): [Node("literal", literal=b"null")],
    **{d: [Node("number")] for d in b"-0123456789"},
}


def _alternatives(node: Node, b: int) -> list[Node]:
    if node.kind == "any":
        return _ANY_BY_BYTE.get(b, [])
    if node.kind == "union":
        return [alt for option in node.options for alt in _alternatives(option, b)]
    return [node]


Stack = list[Frame]


def _step(stack: Stack, b: int) -> list[Stack]:
    """The stacks `stack` becomes after byte b (none: b breaks it; several: alternatives)."""
    top = stack[-1]
    if top.between and b in _WHITESPACE:
        root = stack[0]
        root.spaces += 1
        root.breaks += b in _LINE_BREAKS
        return [stack] if root.spaces <= _MAX_WHITESPACE_RUN and root.breaks <= 1 else []
    if top.between:
        stack[0].spaces = stack[0].breaks = 0
    code, node = top.feed(b)
    if code == OK:
        return [stack]
    if code == FAIL:
        return []
    if code in (DONE, DONE_AGAIN):
        stack.pop()
        stack[-1].child_done(top)
        return [stack] if code == DONE else _step(stack, b)
    alternatives = _alternatives(node, b)
    if len(alternatives) == 1:
        stack.append(_FRAMES[alternatives[0].kind](alternatives[0]))
        return _step(stack, b)
    out: list[Stack] = []
    for alt in alternatives:
        fork = [frame.copy() for frame in stack]
        fork.append(_FRAMES[alt.kind](alt))
        out += _step(fork, b)
    return out


class JsonPrefix:
    """The states some bytes of output can be in; `feed` says whether more bytes keep one."""

    def __init__(self, node: Node = ANY_OBJECT) -> None:
        self._stacks: list[Stack] = [[RootFrame(node)]]

    def copy(self) -> JsonPrefix:
        other = JsonPrefix.__new__(JsonPrefix)
        other._stacks = [[frame.copy() for frame in stack] for stack in self._stacks]
        return other

    @property
    def complete(self) -> bool:
        """A whole value is there (trailing whitespace may still come, nothing else)."""
        return any(len(s) == 1 and s[0].done for s in self._stacks)

    def feed(self, data: bytes) -> bool:
        """Advance over `data`; False when no state survives it (the prefix is then dead)."""
        for b in data:
            self._stacks = [new for stack in self._stacks for new in _step(stack, b)]
            if not self._stacks:
                return False
        return True


class JsonConstraint:
    """One request's structured-output state over its generated tokens."""

    def __init__(
        self,
        token_bytes: Sequence[bytes],
        special_ids: Iterable[int],
        eos_ids: Iterable[int],
        schema: Node = ANY_OBJECT,
    ) -> None:
        self._token_bytes = token_bytes
        self._special = frozenset(special_ids)
        self._eos_ids = list(eos_ids)
        self._eos = frozenset(self._eos_ids)
        self._prefix = JsonPrefix(schema)
        self._seen = 0  # generated tokens fed so far

    def sync(self, generated: Sequence[int]) -> None:
        """Feeds the generated tokens not seen yet (the output only ever grows)."""
        for token in generated[self._seen :]:
            if token not in self._eos:
                self._prefix.feed(self._bytes(token))
        self._seen = len(generated)

    def end_token(self) -> int | None:
        """The end of text once the value is complete (the sampler then ends the output rather
        than let the model pad it with whitespace), else None."""
        return self._eos_ids[0] if self._eos_ids and self._prefix.complete else None

    def allows(self, token: int) -> bool:
        if token in self._eos:
            return self._prefix.complete
        if token in self._special or token >= len(self._token_bytes):
            return False
        data = self._bytes(token)
        return bool(data) and self._prefix.copy().feed(data)

    def _bytes(self, token: int) -> bytes:
        return self._token_bytes[token] if token < len(self._token_bytes) else b""
