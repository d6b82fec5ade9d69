"""Turning successive /status and /metrics readings into rates, means and chart series."""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

TTFT_METRIC = "met_time_to_first_token_seconds"
ITL_METRIC = "met_inter_token_latency_seconds"
HISTORY_POINTS = 180  # three minutes at the one-second poll
RATE_WINDOW_S = 5.0  # a CPU engine answers in bursts; one-second deltas would flicker to zero

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample values by metric name, summed over label sets; histogram buckets are skipped."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1).endswith("_bucket"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        values[match.group(1)] = values.get(match.group(1), 0.0) + value
    return values


@dataclass
class Reading:
    """One poll of the server."""

    time: float
    status: dict[str, Any]
    metrics: dict[str, float]

    @property
    def stats(self) -> dict[str, Any]:
        return self.status.get("stats") or {}

    def counter(self, name: str) -> float:
        return float(self.stats.get(name) or 0)


class ReadingWindow:
    """The last few seconds of readings; rates and means are taken across the whole window."""

    def __init__(self, seconds: float = RATE_WINDOW_S) -> None:
        self.seconds = seconds
        self.readings: deque[Reading] = deque()

    def add(self, reading: Reading) -> Reading | None:
        """Keep `reading`; return the baseline to compare it with (None for the first one)."""
        self.readings.append(reading)
        # Drop the oldest while the next one is itself at least a window old.
        while len(self.readings) > 2 and reading.time - self.readings[1].time >= self.seconds:
            self.readings.popleft()
        return self.readings[0] if len(self.readings) > 1 else None


@dataclass
class Figures:
    """What the overview shows, derived from the latest two readings."""

    running: int = 0
    waiting: int = 0
    kv_used: int = 0
    kv_total: int = 0
    prefix_hit_rate: float = 0.0
    requests_per_s: float = 0.0
    tokens_per_s: float = 0.0
    prompt_tokens_per_s: float = 0.0
    ttft_ms: float | None = None
    itl_ms: float | None = None
    requests_total: int = 0
    generated_total: int = 0
    errors_total: int = 0

    @property
    def kv_percent(self) -> float:
        return 100.0 * self.kv_used / self.kv_total if self.kv_total else 0.0


def derive(previous: Reading | None, current: Reading) -> Figures:
    stats = current.stats
    figures = Figures(
        running=int(stats.get("running") or 0),
        waiting=int(stats.get("waiting") or 0),
        kv_used=int(stats.get("kv_blocks_used") or 0),
        kv_total=int(stats.get("kv_blocks_total") or 0),
        prefix_hit_rate=float(stats.get("prefix_cache_hit_rate") or 0.0),
        requests_total=int(current.counter("requests_total")),
        generated_total=int(current.counter("generated_tokens_total")),
        errors_total=int(current.counter("errors_total")),
    )
    if previous is None:
        return figures
    seconds = max(current.time - previous.time, 1e-6)

    def rate(name: str) -> float:
        # A negative delta means the server restarted; count from zero rather than go negative.
        return max(current.counter(name) - previous.counter(name), 0.0) / seconds

    figures.requests_per_s = rate("requests_total")
    figures.tokens_per_s = rate("generated_tokens_total")
    figures.prompt_tokens_per_s = rate("prompt_tokens_total")
    figures.ttft_ms = _histogram_mean_ms(previous.metrics, current.metrics, TTFT_METRIC)
    figures.itl_ms = _histogram_mean_ms(previous.metrics, current.metrics, ITL_METRIC)
    return figures


def _histogram_mean_ms(
    before: dict[str, float], after: dict[str, float], name: str
) -> float | None:
    """Mean of the observations made between two readings; None when there were none."""
    count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    if count <= 0:
        return None
    total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
    return 1000.0 * total / count


@dataclass
class History:
    """Chart series over the last minutes, one point per poll."""

    tokens_per_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    requests_per_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    ttft_ms: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    itl_ms: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    kv_percent: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    in_flight: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))

    def add(self, figures: Figures) -> None:
        self.tokens_per_s.append(figures.tokens_per_s)
        self.requests_per_s.append(figures.requests_per_s)
        # An idle interval has no latency; carrying the last value keeps the chart readable.
        self.ttft_ms.append(_or_last(figures.ttft_ms, self.ttft_ms))
        self.itl_ms.append(_or_last(figures.itl_ms, self.itl_ms))
        self.kv_percent.append(figures.kv_percent)
        self.in_flight.append(figures.running + figures.waiting)


def _or_last(value: float | None, series: deque[float]) -> float:
    if value is not None:
        return value
    return series[-1] if series else 0.0
