"""pythonic (Llama 3.2 small models, Llama 4): the output is a Python list of calls,
`[get_weather(city="Paris"), get_time()]`, optionally in `<|python_start|>...<|python_end|>`."""

from __future__ import annotations

import ast
import json

from met.chat.parsers.base import ParsedCall, ToolParser

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"


def _list_end(text: str, start: int) -> int | None:
    """Index past the bracket that closes text[start] ('['), skipping Python string literals."""
    depth, quote, escaped = 0, "", False
    for i in range(start, len(text)):
        c = text[i]
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "[({":
            depth += 1
        elif c in "])}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


class PythonicParser(ToolParser):
    name = "pythonic"
    openers = (PYTHON_START, "[")
    at_start_only = True

    def block_end(self, block: str) -> int | None:
        start = block.find("[")
        if start < 0:
            return None
        end = _list_end(block, start)
        if end is not None and block.startswith(PYTHON_START):
            closing = block.find(PYTHON_END, end)
            return None if closing < 0 else closing + len(PYTHON_END)
        return end

    def parse_block(self, block: str) -> list[ParsedCall] | None:
        source = block.removeprefix(PYTHON_START).removesuffix(PYTHON_END).strip()
        try:
            tree = ast.parse(source, mode="eval").body
        except SyntaxError:
            return None
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls = []
        for item in tree.elts:
            if not (isinstance(item, ast.Call) and isinstance(item.func, ast.Name)) or item.args:
                return None
            try:
                arguments = {kw.arg: _literal(kw.value) for kw in item.keywords}
            except ValueError:
                return None
            if None in arguments:
                return None  # **kwargs
            calls.append(ParsedCall(item.func.id, json.dumps(arguments, ensure_ascii=False)))
        return calls


_JSON_NAMES = {"true": True, "false": False, "null": None}


def _literal(node: ast.expr) -> object:
    """A Python literal; JSON's true/false/null too (forced arguments are written as JSON)."""
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    return ast.literal_eval(node)
