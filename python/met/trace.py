"""`met trace`: run a scenario file through the C++ scheduler and the recording fake.

A scenario is a TOML file (docs/trace-format.md). Every accepted key is listed in the schema
tables below; anything else is an error that names the key. The built-in name `batched_mixed`
runs the golden scenario without a file.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from met import _core

BUILTIN = {"batched_mixed"}


class ScenarioError(Exception):
    """A malformed scenario: `key` names the offending key (dotted path)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


# key -> (python type, minimum) per table; a minimum of None means any value of the type.
_MODEL = {
    "vocab": (int, 2),
    "block_size": (int, 1),
    "total_blocks": (int, 0),
    "held_blocks": (int, 0),
    "reclaimable": (int, 0),
    "kv_exhaust_at": (list, 0),
    "verify_exhaust_at": (list, 0),
}
_OPTIONS = {
    "max_batch_size": (int, 1),
    "max_prefill_tokens": (int, 0),
    "max_batch_tokens": (int, 1),
    "max_seq_len": (int, 2),
    "eos_tokens": (list, 0),
    "speculative": (str, None),
    "num_speculative_tokens": (int, 0),
    "ngram_min_match": (int, 1),
    "ngram_max_match": (int, 1),
}
SPECULATIVE = {
    "off": _core.SpecMode.Off,
    "ngram": _core.SpecMode.Ngram,
    "ngram-forced": _core.SpecMode.NgramForced,
}
_REQUEST = {
    "id": (int, 1),
    "prompt_len": (int, 1),
    "toks": (list, 0),
    "max_tokens": (int, 1),
    "streaming": (bool, None),
    "arrive_at_tick": (int, 1),
    "expired_deadline": (bool, None),
    "min_tokens": (int, 0),
    "temperature": (float, 0),
    "top_logprobs": (int, 0),
    "cancel_at": (int, 0),
}
_REQUIRED_REQUEST = ("id", "prompt_len", "toks")
_TOP = {"name", "model", "options", "requests"}
_TYPE_NAMES = {
    int: "an integer",
    bool: "a boolean",
    float: "a number",
    list: "a list of integers",
    str: "a string",
}


def _check(key: str, value: object, kind: type, minimum: int | None) -> object:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is list and ok:
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if not ok:
        raise ScenarioError(key, f"expected {_TYPE_NAMES[kind]}, got {type(value).__name__}")
    if kind is str:
        if value not in SPECULATIVE:
            raise ScenarioError(key, f"expected one of {', '.join(SPECULATIVE)}, got {value!r}")
        return SPECULATIVE[value]
    if kind is list:
        if any(v < 0 for v in value):
            raise ScenarioError(key, "entries must be non-negative")
    elif minimum is not None and value < minimum:
        raise ScenarioError(key, f"must be at least {minimum}")
    return value


def _table(raw: object, key: str, schema: dict[str, tuple[type, int | None]], target: object):
    if not isinstance(raw, dict):
        raise ScenarioError(key, f"expected a table, got {type(raw).__name__}")
    for name, value in raw.items():
        path = f"{key}.{name}"
        if name not in schema:
            raise ScenarioError(path, "unknown key")
        setattr(target, name, _check(path, value, *schema[name]))


def _request(raw: object, index: int) -> _core.ScenarioRequest:
    key = f"requests[{index}]"
    if not isinstance(raw, dict):
        raise ScenarioError(key, f"expected a table, got {type(raw).__name__}")
    for name in _REQUIRED_REQUEST:
        if name not in raw:
            raise ScenarioError(f"{key}.{name}", "missing required key")
    req = _core.ScenarioRequest()
    _table(raw, key, _REQUEST, req)
    if not req.toks:
        raise ScenarioError(f"{key}.toks", "must not be empty")
    return req


def parse_scenario(doc: dict) -> _core.ScenarioSpec:
    """Build a ScenarioSpec from a parsed TOML document; raises ScenarioError."""
    for name in doc:
        if name not in _TOP:
            raise ScenarioError(name, "unknown key")
    if "name" not in doc:
        raise ScenarioError("name", "missing required key")
    if not isinstance(doc["name"], str) or not doc["name"]:
        raise ScenarioError("name", "expected a non-empty string")
    spec = _core.ScenarioSpec()
    spec.name = doc["name"]
    _table(doc.get("model", {}), "model", _MODEL, spec.model)
    _table(doc.get("options", {}), "options", _OPTIONS, spec.options)
    requests = doc.get("requests", [])
    if not isinstance(requests, list):
        raise ScenarioError("requests", "expected an array of tables")
    spec.requests = [_request(raw, i) for i, raw in enumerate(requests)]
    ids = [r.id for r in spec.requests]
    for i, rid in enumerate(ids):
        if rid in ids[:i]:
            raise ScenarioError(f"requests[{i}].id", f"duplicate id {rid}")
    return spec


def load_scenario(source: str) -> _core.ScenarioSpec:
    """A scenario file, or a built-in name; raises ScenarioError or OSError."""
    if source in BUILTIN and not Path(source).exists():
        return _core.batched_mixed_spec()
    try:
        doc = tomllib.loads(Path(source).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError("toml", str(e)) from None
    return parse_scenario(doc)


def run_trace(source: str) -> str:
    """The full trace text of a scenario file or built-in name."""
    return _core.run_scenario(load_scenario(source))


def trace_main(argv: list[str]) -> int:
    """`met trace FILE`: print the trace; on a malformed file one line on stderr and 2."""
    if len(argv) != 1:
        print("usage: met trace FILE|batched_mixed", file=sys.stderr)
        return 2
    source = argv[0]
    try:
        text = run_trace(source)
    except ScenarioError as e:
        print(f"met trace: {source}: {e.key}: {e.problem}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"met trace: {source}: file: {e.strerror or e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(trace_main(sys.argv[1:]))
