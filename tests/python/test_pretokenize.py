"""GGUF pre-tokenizer names resolve to llama.cpp's split regexes."""

from __future__ import annotations

import pytest
from test_gguf import write_tiny_gguf

from met.model.config import ModelLoadError
from met.models import load_model
from met.pretokenize import byte_level_pre, pre_type
from met.tokenizer import Tokenizer

TEXT = "Hello world's 12345 x\n\n  y+="
# The pieces llama.cpp's unicode_regex_split cuts TEXT into for each pre-tokenizer type
# (byte-level: "Ġ" is a space, "Ċ" a newline).
PIECES = {
    "gpt2": ["Hello", "Ġworld", "'s", "Ġ12345", "Ġx", "ĊĊĠ", "Ġy", "+="],
    "llama3": ["Hello", "Ġworld", "'s", "Ġ", "123", "45", "Ġx", "ĊĊ", "Ġ", "Ġy", "+="],
    "qwen2": ["Hello", "Ġworld", "'s", "Ġ", *"12345", "Ġx", "ĊĊ", "Ġ", "Ġy", "+="],
    "starcoder": ["Hello", "Ġworld", "'s", "Ġ", *"12345", "Ġx", "ĊĊĠ", "Ġy", "+="],
    # default: punctuation first, then GPT-2's regex, digit runs, then digit triples.
    "default": ["Hello", "Ġworld", "'", "s", "Ġ", "123", "45", "Ġx", "ĊĊĠ", "Ġy", "+="],
    "gpt4o": ["Hello", "Ġworld's", "Ġ", "123", "45", "Ġx", "ĊĊ", "Ġ", "Ġy", "+="],
}


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("gpt-2", "gpt2"),
        ("gpt2", "gpt2"),
        ("phi-2", "gpt2"),
        ("llama-bpe", "llama3"),
        ("llama3", "llama3"),
        ("dbrx", "llama3"),
        ("qwen2", "qwen2"),
        ("deepseek-r1-qwen", "qwen2"),
        ("smollm", "starcoder"),
        ("command-r", "starcoder"),
        ("default", "default"),
        (None, "default"),
        ("gpt-4o", "gpt4o"),
    ],
)
def test_names_split_as_llama_cpp_does(name, kind):
    assert pre_type(name) == kind
    pieces = [p for p, _ in byte_level_pre(kind).pre_tokenize_str(TEXT)]
    assert pieces == PIECES[kind]


def test_every_type_compiles():
    from met.pretokenize import known_names

    for name in known_names():
        assert byte_level_pre(pre_type(name)).pre_tokenize_str(TEXT)


def test_a_gpt_2_file_loads_and_an_unknown_name_is_one_clear_line(tmp_path):
    path = tmp_path / "gpt-2.gguf"
    write_tiny_gguf(path, pre="gpt-2")
    tok = Tokenizer.from_gguf(path)
    assert tok.decode(tok.encode("hello world 42")) == "hello world 42"
    bad = tmp_path / "odd.gguf"
    write_tiny_gguf(bad, pre="no-such-pre")
    with pytest.raises(ModelLoadError) as err:
        load_model(bad, device="cpu")
    message = str(err.value)
    assert "odd.gguf" in message and "'no-such-pre'" in message and "\n" not in message
