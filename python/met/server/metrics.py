"""Prometheus text exposition (format 0.0.4) of the server's counters, histograms and gauges."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from met.engine.outputs import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if isinstance(value, float) else str(value)


def _header(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]


class Counter:
    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1, *labels: str) -> None:
        self.values[labels] = self.values.get(labels, 0) + amount

    def total(self) -> float:
        return sum(self.values.values())

    def render(self) -> list[str]:
        lines = _header(self.name, "counter", self.help)
        values = self.values or ({} if self.label_names else {(): 0})
        for key, value in sorted(values.items()):
            lines.append(f"{self.name}{_labels(self.label_names, key)} {_number(value)}")
        return lines


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        self.name, self.help, self.bounds = name, help_text, tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last slot is the +Inf overflow
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def render(self) -> list[str]:
        lines = _header(self.name, "histogram", self.help)
        cumulative = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            cumulative += count
            lines.append(f'{self.name}_bucket{{le="{_number(bound)}"}} {cumulative}')
        lines.append(f"{self.name}_sum {_number(self.sum)}")
        lines.append(f"{self.name}_count {self.count}")
        return lines


def gauge(name: str, help_text: str, value: float) -> list[str]:
    return [*_header(name, "gauge", help_text), f"{name} {_number(value)}"]


def hit_rate(stats: EngineStats) -> float:
    queried = stats.prefix_cache_queried_tokens
    return stats.prefix_cache_hit_tokens / queried if queried else 0.0


class ServerMetrics:
    """Everything /metrics exposes; updated on the event loop, so no locking."""

    def __init__(self) -> None:
        self.requests = Counter(
            "met_requests_total",
            "HTTP API requests by status code and finish reason.",
            ("code", "finish"),
        )
        self.prompt_tokens = Counter(
            "met_prompt_tokens_total", "Prompt tokens of admitted requests."
        )
        self.generation_tokens = Counter(
            "met_generation_tokens_total", "Tokens generated and delivered to clients."
        )
        self.ttft = Histogram(
            "met_time_to_first_token_seconds", "Time from arrival to first token.", _LATENCY_BUCKETS
        )
        self.itl = Histogram(
            "met_inter_token_latency_seconds", "Time between successive tokens.", _LATENCY_BUCKETS
        )
        self.e2e = Histogram(
            "met_e2e_request_latency_seconds", "Time from arrival to last token.", _E2E_BUCKETS
        )

    def render(self, stats: EngineStats | None, ready: bool) -> str:
        stats = stats or EngineStats()
        used, total = stats.kv_blocks_used, stats.kv_blocks_total
        sections: Iterable[list[str]] = (
            self.requests.render(),
            self.prompt_tokens.render(),
            self.generation_tokens.render(),
            self.ttft.render(),
            self.itl.render(),
            self.e2e.render(),
            gauge("met_ready", "1 once the model is loaded.", int(ready)),
            gauge("met_num_requests_running", "Sequences being generated.", stats.num_running),
            gauge(
                "met_num_requests_waiting", "Sequences waiting to be scheduled.", stats.num_waiting
            ),
            gauge("met_kv_blocks_used", "KV cache blocks in use.", used),
            gauge("met_kv_blocks_total", "KV cache blocks in the pool.", total),
            gauge(
                "met_kv_cache_usage_ratio",
                "Fraction of KV blocks in use.",
                used / total if total else 0.0,
            ),
            gauge(
                "met_prefix_cache_hit_rate",
                "Prompt tokens served from the prefix cache.",
                hit_rate(stats),
            ),
        )
        return "\n".join(line for section in sections for line in section) + "\n"
