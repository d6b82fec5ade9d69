"""JSON schemas compiled for structured output: the subset met can enforce token by token.

compile_schema turns a JSON schema (OpenAI's response_format json_schema, or {"type": "object"}
for JSON mode) into Nodes that met.model.json_mode walks byte by byte. Supported: type (one or a
list), properties / required / additionalProperties, items / minItems / maxItems, enum and
const of scalars, anyOf / oneOf (treated alike: some alternative holds), local $ref into $defs or
definitions. Annotations (title, description, format, default, examples, ...) are ignored, as the
JSON Schema spec lets validators do. Everything else (pattern, minimum, minLength, allOf, not,
prefixItems, ...) raises SchemaError naming the keyword rather than being silently ignored.

An object schema with properties but no additionalProperties produces only those properties
(llama.cpp's and OpenAI's strict behaviour); additionalProperties: true or a schema allows more.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class SchemaError(ValueError):
    """A schema met cannot enforce (or that is not a schema at all)."""


@dataclass(eq=False)
class Node:
    """One compiled schema. kind: any | object | array | string | number | integer | boolean |
    null | literal | union."""

    kind: str
    props: dict[bytes, Node] = field(default_factory=dict)  # object: escaped key -> value
    required: frozenset[bytes] = frozenset()
    extra: Node | None = None  # object: the schema of other keys; None: no other keys
    items: Node | None = None  # array
    min_items: int = 0
    max_items: int | None = None
    enum: frozenset[bytes] | None = None  # string: the escaped bodies allowed
    literal: bytes = b""  # literal: the exact text (true, false, null, a number)
    options: list[Node] = field(default_factory=list)  # union


ANY = Node("any")
ANY_OBJECT = Node("object", extra=ANY)

_ANNOTATIONS = {
    "title",
    "description",
    "format",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
    "$schema",
    "$id",
    "$defs",
    "definitions",
    "strict",
}
_KEYWORDS = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "$ref",
}
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


def escaped(text: str) -> bytes:
    """A string's body as JSON writes it (no ASCII escaping): what the model must produce."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


def compile_schema(schema: Any) -> Node:
    return _Compiler(schema).node(schema, "schema")


class _Compiler:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.refs: dict[str, Node] = {}

    def node(self, schema: Any, where: str) -> Node:
        if schema is True or schema == {}:
            return ANY
        if not isinstance(schema, dict):
            raise SchemaError(f"{where}: a schema must be an object or true")
        unknown = sorted(set(schema) - _KEYWORDS - _ANNOTATIONS)
        if unknown:
            raise SchemaError(f"{where}: '{unknown[0]}' is not supported in schemas")
        if "$ref" in schema:
            return self.ref(schema["$ref"], where)
        if "const" in schema:
            return self.values([schema["const"]], where)
        if "enum" in schema:
            return self.values(schema["enum"], where)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = schema[key]
                if not isinstance(options, list) or not options:
                    raise SchemaError(f"{where}.{key}: must be a non-empty list")
                return Node("union", options=[self.node(o, f"{where}.{key}") for o in options])
        return self.typed(schema, where)

    def typed(self, schema: dict, where: str) -> Node:
        kinds = schema.get("type")
        if kinds is None:
            kinds = ["object"] if "properties" in schema else list(_TYPES)
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not kinds or any(k not in _TYPES for k in kinds):
            raise SchemaError(f"{where}.type: must be one or more of {', '.join(_TYPES)}")
        nodes = [self.one_type(kind, schema, where) for kind in kinds]
        return nodes[0] if len(nodes) == 1 else Node("union", options=nodes)

    def one_type(self, kind: str, schema: dict, where: str) -> Node:
        if kind == "object":
            return self.object(schema, where)
        if kind == "array":
            return self.array(schema, where)
        if kind in ("boolean", "null"):
            words = [b"true", b"false"] if kind == "boolean" else [b"null"]
            nodes = [Node("literal", literal=w) for w in words]
            return nodes[0] if len(nodes) == 1 else Node("union", options=nodes)
        return Node(kind)

    def object(self, schema: dict, where: str) -> Node:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(props, dict) or not isinstance(required, list):
            raise SchemaError(f"{where}: properties must be an object and required a list")
        missing = [r for r in required if r not in props]
        if missing:
            raise SchemaError(f"{where}.required: '{missing[0]}' is not among the properties")
        extra = schema.get("additionalProperties", not props)
        node = Node("object", required=frozenset(escaped(r) for r in required))
        node.props = {escaped(k): self.node(v, f"{where}.properties.{k}") for k, v in props.items()}
        node.extra = None if extra is False else self.node(extra, f"{where}.additionalProperties")
        return node

    def array(self, schema: dict, where: str) -> Node:
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        if not isinstance(low, int) or (high is not None and not isinstance(high, int)):
            raise SchemaError(f"{where}: minItems and maxItems must be integers")
        if high is not None and high < low:
            raise SchemaError(f"{where}: maxItems is below minItems")
        items = self.node(schema.get("items", True), f"{where}.items")
        return Node("array", items=items, min_items=low, max_items=high)

    def values(self, values: Any, where: str) -> Node:
        if not isinstance(values, list) or not values:
            raise SchemaError(f"{where}.enum: must be a non-empty list")
        strings = [v for v in values if isinstance(v, str)]
        nodes = [Node("string", enum=frozenset(escaped(s) for s in strings))] if strings else []
        for value in values:
            if isinstance(value, (dict, list)):
                raise SchemaError(f"{where}: enum and const values must be scalars")
            if not isinstance(value, str):
                nodes.append(Node("literal", literal=json.dumps(value).encode()))
        return nodes[0] if len(nodes) == 1 else Node("union", options=nodes)

    def ref(self, ref: Any, where: str) -> Node:
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise SchemaError(f"{where}.$ref: only local references (#/...) are supported")
        if ref not in self.refs:
            target: Any = self.root
            for part in ref[2:].split("/"):
                if not isinstance(target, dict) or part not in target:
                    raise SchemaError(f"{where}.$ref: '{ref}' points nowhere")
                target = target[part]
            # A placeholder first, filled in place: a recursive schema refers back to it.
            self.refs[ref] = placeholder = Node("any")
            compiled = self.node(target, ref)
            placeholder.__dict__.update(compiled.__dict__)
        return self.refs[ref]
