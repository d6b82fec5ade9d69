"""`met run`, `met chat` and `met bench` on the real default model (slow: they load it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pexpect
import pytest
from met_cli_support import free_port, live_server, met_env, run_met

from met.tui.metrics import parse_prometheus

pytestmark = pytest.mark.slow

PROMPT = "Name three colours."


@pytest.fixture(scope="module")
def server_url(default_model_path: Path):
    with live_server(default_model_path, free_port()) as url:
        yield url


def test_run_with_a_seed_repeats_itself(default_model_path: Path) -> None:
    args = [
        "run",
        "--model",
        str(default_model_path),
        "--seed",
        "7",
        "--temperature",
        "0.9",
        "--max-tokens",
        "12",
        PROMPT,
    ]
    first, second = run_met(*args, timeout=300), run_met(*args, timeout=300)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip()
    assert first.stdout == second.stdout


def test_run_json_from_stdin(default_model_path: Path) -> None:
    result = run_met(
        "run",
        "--model",
        str(default_model_path),
        "--json",
        "-n",
        "2",
        "--max-tokens",
        "6",
        "--temperature",
        "0",
        "-",
        stdin=PROMPT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert len(report["choices"]) == 2
    for choice in report["choices"]:
        assert choice["finish_reason"] in ("stop", "length")
        assert 0 < len(choice["token_ids"]) <= 6
    # Greedy decoding: both samples agree.
    assert report["choices"][0]["text"] == report["choices"][1]["text"]
    assert report["usage"]["prompt_tokens"] > 0
    assert report["usage"]["completion_tokens"] == sum(
        len(c["token_ids"]) for c in report["choices"]
    )


def test_run_raw_completion(default_model_path: Path) -> None:
    result = run_met(
        "run",
        "--model",
        str(default_model_path),
        "--raw",
        "--max-tokens",
        "5",
        "--temperature",
        "0",
        "The capital of France is",
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_chat_two_turns_then_exit(default_model_path: Path) -> None:
    child = pexpect.spawn(
        sys.executable,
        [
            "-m",
            "met.cli",
            "chat",
            "--model",
            str(default_model_path),
            "--max-tokens",
            "8",
            "--temperature",
            "0",
        ],
        env=met_env(),
        encoding="utf-8",
        timeout=300,
    )
    child.expect_exact(">>> ")
    child.sendline("Hello! What is your name?")
    child.expect_exact(">>> ")
    first_answer = child.before.strip()
    child.sendline("And what is 2 + 2?")
    child.expect_exact(">>> ")
    assert first_answer
    assert child.before.strip()
    child.sendline("/reset")
    child.expect_exact("(conversation cleared)")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def _counters(url: str) -> tuple[dict, dict[str, float]]:
    stats = httpx.get(f"{url}/status", timeout=10).json()["stats"]
    return stats, parse_prometheus(httpx.get(f"{url}/metrics", timeout=10).text)


def test_bench_agrees_with_the_server_counters(server_url: str) -> None:
    # --model given, so bench sends nothing but the measured requests (the server counts every
    # API request, /v1/models included).
    model = httpx.get(f"{server_url}/v1/models", timeout=10).json()["data"][0]["id"]
    stats_before, metrics_before = _counters(server_url)
    result = run_met(
        "bench",
        "--url",
        server_url,
        "--model",
        model,
        "--num-requests",
        "6",
        "--concurrency",
        "3",
        "--prompt-len",
        "16",
        "--output-len",
        "8",
        "--json",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    stats_after, metrics_after = _counters(server_url)
    assert report["completed"] == 6 and report["errors"] == 0
    assert stats_after["requests_total"] - stats_before["requests_total"] == report["completed"]
    assert (
        metrics_after["met_requests_total"] - metrics_before["met_requests_total"]
        == report["completed"]
    )
    generated = stats_after["generated_tokens_total"] - stats_before["generated_tokens_total"]
    assert generated == report["output_tokens"]
    prompt = stats_after["prompt_tokens_total"] - stats_before["prompt_tokens_total"]
    assert prompt == report["prompt_tokens"]
    assert 0 < report["ttft_s"]["p50"] <= report["e2e_latency_s"]["p99"]
    assert report["output_token_throughput"] > 0


def test_doctor_with_a_model_explains_its_capacity_plan(default_model_path: Path) -> None:
    result = run_met(
        "doctor",
        "--model",
        str(default_model_path),
        "--max-num-seqs",
        "2",
        "--max-model-len",
        "2048",
        timeout=300,
    )
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["ok", "capacity"])
    plan = " ".join(line.strip() for line in lines[at + 1 : -1])
    # 2048 tokens are 129 blocks of 16 with the next position; two full contexts, 258 blocks.
    assert "KV cache 258 blocks of 16 = 4128 tokens (float16, 22.5 KiB a token" in plan, plan
    assert "room for --max-num-seqs 2 full contexts" in plan
    assert "2 sequences of the full 2048-token context or 3 of 1024 tokens" in plan
    assert "at most 2 run at once" in plan and "--kv-cache-blocks" in plan
    assert plan.startswith("weights ") and " MiB on cpu;" in plan
