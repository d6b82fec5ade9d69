"""Figures `met bench` reports: per-request timings summarised as percentiles and throughput."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    ok: bool
    start: float
    end: float
    ttft: float | None = None  # seconds to the first content token
    token_gaps: list[float] = field(default_factory=list)  # between successive content chunks
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str = ""

    @property
    def latency(self) -> float:
        return self.end - self.start


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Sequence[float]) -> dict[str, float]:
    figures = {"mean": sum(values) / len(values) if values else math.nan}
    figures.update({f"p{q}": percentile(values, q) for q in PERCENTILES})
    return figures


def summarize(results: Sequence[RequestResult], duration: float) -> dict[str, Any]:
    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    prompt_tokens = sum(r.prompt_tokens for r in done)
    output_tokens = sum(r.completion_tokens for r in done)
    seconds = max(duration, 1e-9)
    return {
        "duration_s": duration,
        "completed": len(done),
        "errors": len(failed),
        "error_samples": sorted({r.error for r in failed})[:5],
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "request_throughput": len(done) / seconds,
        "output_token_throughput": output_tokens / seconds,
        "total_token_throughput": (prompt_tokens + output_tokens) / seconds,
        "ttft_s": distribution([r.ttft for r in done if r.ttft is not None]),
        "itl_s": distribution([gap for r in done for gap in r.token_gaps]),
        "e2e_latency_s": distribution([r.latency for r in done]),
    }


def format_report(summary: dict[str, Any]) -> str:
    lines = [
        f"completed requests      {summary['completed']}",
        f"errors                  {summary['errors']}",
        f"duration                {summary['duration_s']:.2f} s",
        f"prompt tokens           {summary['prompt_tokens']}",
        f"output tokens           {summary['output_tokens']}",
        f"request throughput      {summary['request_throughput']:.2f} req/s",
        f"output token throughput {summary['output_token_throughput']:.1f} tok/s",
        f"total token throughput  {summary['total_token_throughput']:.1f} tok/s",
        "",
        f"{'(ms)':<24}{'mean':>9}" + "".join(f"{'p' + str(q):>9}" for q in PERCENTILES),
    ]
    for label, key in (
        ("time to first token", "ttft_s"),
        ("inter-token latency", "itl_s"),
        ("end-to-end latency", "e2e_latency_s"),
    ):
        figures = summary[key]
        cells = [figures["mean"]] + [figures[f"p{q}"] for q in PERCENTILES]
        lines.append(f"{label:<24}" + "".join(f"{v * 1000:>9.1f}" for v in cells))
    for sample in summary["error_samples"]:
        lines.append(f"error: {sample}")
    return "\n".join(lines)
