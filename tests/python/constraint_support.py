"""Helpers of the structured-output tests: a small real tokenizer with special tokens, and the
checks of a constrained answer."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance as llg
from model_fixtures import byte_tokenizer_json

from met.constraints import grammar_text
from met.sampling import Constraint
from met.tokenizer import Tokenizer, byte_level_bytes

SPECIALS = ["<|end|>", "<tool_call>", "</tool_call>"]  # ids 256, 257, 258; <|end|> stops
_BYTES = llg.LLTokenizer("byte")


def byte_tokenizer(folder: Path) -> Tokenizer:
    """met's tokenizer over a byte-level vocabulary (id = byte value) plus three special
    tokens, read from a Hugging Face folder as a model's would be."""
    spec = json.loads(byte_tokenizer_json())
    chars = spec["model"]["vocab"]
    spec["model"]["vocab"] = {c: byte_level_bytes([c], set())[0][0] for c in chars}  # id = byte
    spec["added_tokens"] = [
        {"id": 256 + i, "content": t, "special": True, "single_word": False, "lstrip": False}
        | {"rstrip": False, "normalized": False}
        for i, t in enumerate(SPECIALS)
    ]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))
    return Tokenizer.from_hf_folder(folder)


def accepts(c: Constraint, text: str, complete: bool = True) -> bool:
    """Whether `text` is a value of the constraint (or, complete=False, a prefix of one)."""
    matcher = llg.LLMatcher(_BYTES, grammar_text(c), log_level=0)
    if not matcher.consume_tokens(list(text.encode())):
        return False
    return matcher.is_accepting() or not complete


def assert_json_answer(text: str, finish_reason: str, c: Constraint | None = None) -> None:
    """A finished answer is one JSON value of the constraint (any object by default); one cut
    by max_tokens is a prefix of one."""
    c = c or Constraint("json_object")
    assert accepts(c, text, complete=False), text
    if finish_reason == "stop":
        assert accepts(c, text), text
        json.loads(text)
        assert text == text.strip(), "the output ends with the value, not with padding"
    else:
        assert finish_reason == "length" and not accepts(c, text), text
