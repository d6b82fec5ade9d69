"""`met` as a subprocess, without a model: help, usage errors, runtime errors, bench arithmetic."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from met_cli_support import met_env, run_met
from openai_stub import REPLY_WORDS, start_stub

from met import _core
from met.commands.bench_stats import RequestResult, percentile, summarize

SUBCOMMANDS = ["serve", "run", "chat", "bench", "pull", "models", "doctor", "top"]


@pytest.fixture(scope="module")
def stub():
    server, state = start_stub()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()


def test_help_lists_every_subcommand() -> None:
    result = run_met("--help")
    assert result.returncode == 0
    for name in [*SUBCOMMANDS, "trace"]:
        assert name in result.stdout


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_help(name: str) -> None:
    result = run_met(name, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["frobnicate"],
        ["run"],  # the prompt is required
        ["run", "hi", "--max-tokens", "0"],
        ["bench", "--concurrency", "-3"],
        ["bench", "--duration", "1", "--num-requests", "3"],
        ["models", "--no-such-flag"],
        ["serve", "--port", "not-a-number"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    result = run_met(*args)
    assert result.returncode == 2, result.stderr
    assert "usage:" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_model_file_is_one_line_error() -> None:
    result = run_met("run", "--model", "/nonexistent/model.gguf", "hello")
    assert result.returncode == 1
    assert result.stderr.startswith("met: error: /nonexistent/model.gguf: no such model file")
    assert len(result.stderr.strip().splitlines()) == 1


def test_debug_shows_the_traceback() -> None:
    result = run_met("--debug", "run", "--model", "/nonexistent/model.gguf", "hello")
    assert result.returncode == 1
    assert "Traceback" in result.stderr
    assert "met: error: /nonexistent/model.gguf: no such model file" in result.stderr


def test_empty_prompt_from_stdin_is_rejected() -> None:
    result = run_met("run", "-", stdin="   \n")
    assert result.returncode == 1
    assert "met: error: the prompt is empty" in result.stderr


@pytest.mark.parametrize("command", [["bench", "--url"], ["top"]])
def test_unreachable_url_exits_1(command: list[str]) -> None:
    # Port 9 (discard) on loopback: nothing listens there in a test environment.
    result = run_met(*command, "http://127.0.0.1:9", timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("met: error: cannot reach http://127.0.0.1:9")
    assert "Traceback" not in result.stderr


def test_trace_hands_the_scenario_to_the_tracer() -> None:
    result = run_met("trace", "batched_mixed")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# scenario batched_mixed")


def test_doctor_reports_each_check_as_ok_or_problem() -> None:
    result = run_met("doctor")
    lines = result.stdout.strip().splitlines()
    checks = lines[:-1]
    assert {line.split()[0] for line in checks} <= {"ok", "problem"}
    assert [line.split()[1] for line in checks][:3] == ["python", "torch", "met._core"]
    problems = sum(line.startswith("problem") for line in checks)
    assert result.returncode == (1 if problems else 0)
    assert all("->" in line for line in checks if line.startswith("problem"))
    core = next(line for line in checks if line.split()[1] == "met._core")
    assert f"CPU kernels: {_core.cpu.cpu_path()}" in core
    cpu = next(line for line in checks if line.split()[1:3] == ["cpu", "path"])
    default = _core.cpu.default_path()
    assert f"{default} path (default; matmul " in cpu
    # The default is the fastest path the CPU runs: amx wherever the tiles can run.
    support = _core.cpu.path_support()
    fastest = next(p for p in ("amx", "avx512", "avx2", "scalar") if support[p] == "")
    assert default == fastest


def test_doctor_names_the_default_when_met_cpu_isa_forces_another_path() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "met.cli", "doctor"],
        capture_output=True,
        text=True,
        env=met_env(MET_CPU_ISA="scalar"),
        timeout=120,
    )
    cpu = next(line for line in result.stdout.splitlines() if line.split()[1:3] == ["cpu", "path"])
    assert f"scalar path (forced by MET_CPU_ISA; the default is {_core.cpu.default_path()}" in cpu


@pytest.mark.parametrize("path", ["scalar", "avx2", "avx512", "amx", "sse9"])
def test_met_cpu_isa_forces_the_kernel_path_or_says_why_not(path: str) -> None:
    probe = "from met import _core; print(_core.cpu.cpu_path())"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=met_env(MET_CPU_ISA=path),
        timeout=60,
    )
    why = _core.cpu.path_support().get(path, "must be scalar, avx2, avx512 or amx")
    if why:
        assert result.returncode != 0
        assert "MET_CPU_ISA" in result.stderr and why in result.stderr
    else:
        assert result.stdout.strip() == path


def test_bench_counts_match_the_stub(stub) -> None:
    url, state = stub
    before = state.requests
    result = run_met(
        "bench",
        "--url",
        url,
        "--num-requests",
        "9",
        "--concurrency",
        "3",
        "--output-len",
        "2",
        "--warmup",
        "2",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["completed"] == 9 and report["errors"] == 0
    assert report["warmup_requests"] == 2
    assert state.requests - before == 9 + 2
    assert report["output_tokens"] == 9 * 2  # the stub's usage: two words for max_tokens=2
    assert report["model"] == "stub-model"
    assert 0 < report["ttft_s"]["p50"] <= report["e2e_latency_s"]["p50"]
    assert "bench [" in result.stderr  # the progress bar


def test_bench_duration_and_rate_text_report(stub) -> None:
    url, _ = stub
    result = run_met("bench", "--url", url, "--duration", "1", "--request-rate", "10")
    assert result.returncode == 0, result.stderr
    for label in ("time to first token", "inter-token latency", "end-to-end latency", "p99"):
        assert label in result.stdout


def test_bench_prompts_file(stub, tmp_path) -> None:
    url, _ = stub
    prompts = tmp_path / "prompts.txt"
    prompts.write_text('plain line\n{"prompt": "from json"}\n\n')
    result = run_met(
        "bench", "--url", url, "--prompts-file", str(prompts), "--num-requests", "4", "--json"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["completed"] == 4
    assert len(REPLY_WORDS) == 3


def test_percentile_interpolates_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(7.6)
    assert percentile(values, 99) == pytest.approx(9.76)
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))


def test_summary_counts_only_successful_requests() -> None:
    results = [
        RequestResult(
            ok=True,
            start=0.0,
            end=1.0,
            ttft=0.2,
            token_gaps=[0.1, 0.3],
            prompt_tokens=5,
            completion_tokens=3,
        ),
        RequestResult(ok=False, start=0.0, end=0.5, error="HTTP 503: busy"),
    ]
    summary = summarize(results, duration=2.0)
    assert summary["completed"] == 1 and summary["errors"] == 1
    assert summary["output_token_throughput"] == 1.5
    assert summary["itl_s"]["p50"] == pytest.approx(0.2)
    assert summary["error_samples"] == ["HTTP 503: busy"]
