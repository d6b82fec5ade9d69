"""Trace parity: the golden batched_mixed, every tests/scenarios/*.toml, and the TOML errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from met.trace import run_trace, trace_main

REPO = Path(__file__).parents[2]
GOLDEN = REPO / "tests/scenarios/batched_mixed.trace"  # the seed golden, copied byte for byte
SCENARIOS = sorted((REPO / "tests/scenarios").glob("*.toml"))


def test_batched_mixed_matches_the_golden_byte_for_byte():
    assert run_trace("batched_mixed") == GOLDEN.read_text()


@pytest.mark.parametrize("toml", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_matches_its_trace(toml: Path):
    assert run_trace(str(toml)) == toml.with_suffix(".trace").read_text()


def test_trace_main_prints_the_trace(capsys):
    assert trace_main(["batched_mixed"]) == 0
    assert capsys.readouterr().out.startswith("# scenario batched_mixed\n")


BASE = 'name = "x"\n[[requests]]\nid = 1\nprompt_len = 2\ntoks = [5, 63]\n'


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        (BASE + "colour = 3\n", "requests[0].colour", "unknown key"),
        (
            BASE.replace("[[requests]]", "[model]\nvocabulary = 3\n[[requests]]"),
            "model.vocabulary",
            "unknown key",
        ),
        ("oops = 1\n" + BASE, "oops", "unknown key"),
        (BASE.replace("prompt_len = 2\n", ""), "requests[0].prompt_len", "missing required key"),
        (BASE.replace('name = "x"\n', ""), "name", "missing required key"),
        (BASE + 'max_tokens = "ten"\n', "requests[0].max_tokens", "expected an integer, got str"),
        (BASE + "streaming = 1\n", "requests[0].streaming", "expected a boolean, got int"),
        (
            BASE.replace("[[requests]]", "[options]\neos_tokens = 63\n[[requests]]"),
            "options.eos_tokens",
            "expected a list of integers, got int",
        ),
        (
            BASE.replace("[[requests]]", '[options]\nspeculative = "fast"\n[[requests]]'),
            "options.speculative",
            "expected one of off, ngram, ngram-forced, got 'fast'",
        ),
        (BASE + "prompt_len = 0\n", "toml", None),
    ],
)
def test_malformed_file_is_one_line_and_exit_2(tmp_path, capsys, text, key, problem):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert trace_main([str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1
    prefix = f"met trace: {path}: {key}: "
    assert lines[0].startswith(prefix)
    if problem is not None:
        assert lines[0] == prefix + problem


def test_missing_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert trace_main([str(tmp_path / "none.toml")]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
