"""/metrics on prometheus_client: met_ counters and histograms by API, engine gauges read at
scrape time, and the standard process, platform and garbage-collector collectors."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from met.engine.outputs import EngineStats, SpecStats

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)

# The `api` label: one value per generation API (and per other route), never the raw path, so an
# unknown URL cannot grow the label set.
_APIS = {
    "/chat/completions": "chat",
    "/completions": "completions",
    "/messages": "messages",
    "/messages/count_tokens": "count_tokens",
    "/responses": "responses",
    "/models": "models",
    "/embeddings": "embeddings",
    "/rerank": "rerank",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
    "/version": "version",
}


# The generation APIs whose series exist from the start (at zero), so that a dashboard or a rate()
# sees them before the first request; a route that generates adds its label here.
GENERATION_APIS = ("chat", "completions", "messages", "responses")


def api_label(path: str) -> str:
    """The `api` label of a request path, with or without the /v1 prefix."""
    bare = path.removeprefix("/v1") if path.startswith("/v1/") else path
    if bare.startswith("/requests/"):
        return "requests"
    if bare.startswith("/responses/"):  # a stored response, read or deleted
        return "responses"
    if path == "/" or path.startswith("/webui/"):
        return "webui"
    return _APIS.get(bare, "other")


def hit_rate(stats: EngineStats) -> float:
    queried = stats.prefix_cache_queried_tokens
    return stats.prefix_cache_hit_tokens / queried if queried else 0.0


StatsSource = Callable[[], "tuple[EngineStats | None, bool]"]
# Per model: (name, state: loaded | loading | unloaded | failed, its stats while loaded).
ModelsSource = Callable[[], "list[tuple[str, str, EngineStats | None]]"]
_MODEL_STATES = ("loaded", "loading", "unloaded", "failed")


class _EngineCollector(Collector):
    """Gauges of what the engine holds now, read once per scrape (never stale, never pushed)."""

    def __init__(self, source: StatsSource, models: ModelsSource | None) -> None:
        self.source = source
        self.models = models

    def collect(self) -> Iterator[Metric]:
        stats, ready = self.source()
        stats = stats or EngineStats()
        used, total = stats.kv_blocks_used, stats.kv_blocks_total
        gauges = (
            ("met_ready", "1 once the model is loaded.", int(ready)),
            ("met_num_requests_running", "Sequences being generated.", stats.num_running),
            ("met_num_requests_waiting", "Sequences waiting to be scheduled.", stats.num_waiting),
            ("met_kv_blocks_used", "KV cache blocks in use.", used),
            ("met_kv_blocks_total", "KV cache blocks in the pool.", total),
            (
                "met_kv_cache_usage_ratio",
                "Fraction of KV blocks in use.",
                used / total if total else 0.0,
            ),
            (
                "met_prefix_cache_hit_rate",
                "Prompt tokens served from the prefix cache.",
                hit_rate(stats),
            ),
        )
        for name, help_text, value in gauges:
            yield GaugeMetricFamily(name, help_text, value=value)
        # What a prefix-aware router (llm-d's scorer) rates over time, as vLLM's counters.
        yield CounterMetricFamily(
            "met_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            value=stats.prefix_cache_queried_tokens,
        )
        yield CounterMetricFamily(
            "met_prefix_cache_hits",
            "Prompt tokens found in the prefix cache.",
            value=stats.prefix_cache_hit_tokens,
        )
        yield CounterMetricFamily(
            "met_num_preemptions",
            "Sequences preempted (requeued, prefilled again later) because the KV pool ran out.",
            value=stats.preemptions,
        )
        if stats.speculation is not None:
            yield from _spec_metrics(stats.speculation)
        if self.models is not None:
            yield from _model_metrics(self.models())


def _model_metrics(models: list[tuple[str, str, EngineStats | None]]) -> Iterator[Metric]:
    """Each model's own gauges, labelled by model: the server-wide ones above are their sums."""
    config = GaugeMetricFamily(
        "met_cache_config_info",
        "The KV cache's shape per loaded model (vLLM's cache_config_info, for routers).",
        labels=("model", "block_size", "num_blocks"),
    )
    state = GaugeMetricFamily(
        "met_model_state", "1 for the state each model is in.", labels=("model", "state")
    )
    running = GaugeMetricFamily(
        "met_model_requests_running", "Sequences being generated.", labels=("model",)
    )
    waiting = GaugeMetricFamily(
        "met_model_requests_waiting", "Sequences waiting to be scheduled.", labels=("model",)
    )
    usage = GaugeMetricFamily(
        "met_model_kv_cache_usage_ratio", "Fraction of KV blocks in use.", labels=("model",)
    )
    for name, status, stats in models:
        for value in _MODEL_STATES:
            state.add_metric((name, value), int(status == value))
        if stats is not None and stats.kv_blocks_total:
            shape = (name, str(stats.kv_block_size), str(stats.kv_blocks_total))
            config.add_metric(shape, 1)
        stats = stats or EngineStats()
        running.add_metric((name,), stats.num_running)
        waiting.add_metric((name,), stats.num_waiting)
        total = stats.kv_blocks_total
        usage.add_metric((name,), stats.kv_blocks_used / total if total else 0.0)
    yield from (config, state, running, waiting, usage)


# Width buckets the gate keeps apart, labelled by the decode widths each covers.
_WIDTHS = ("1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", "65-128")


def _spec_metrics(spec: SpecStats) -> Iterator[Metric]:
    counters = (
        ("met_spec_draft_tokens", "Draft tokens verified.", spec.drafted),
        ("met_spec_accepted_tokens", "Draft tokens accepted.", spec.accepted),
        ("met_spec_verify_steps", "Decode steps that verified drafts.", spec.verify_steps),
        (
            "met_spec_withheld_tokens",
            "Proposed draft tokens not verified: the planner judged them not worth their rows.",
            spec.withheld,
        ),
        ("met_spec_gate_switches", "Times the gate switched a width bucket.", spec.gate_switches),
        ("met_spec_gate_probes", "Probes of the other mode by the gate.", spec.gate_probes),
        ("met_spec_proposer_seconds", "Wall time spent proposing drafts.", spec.proposer_seconds),
    )
    for name, help_text, value in counters:
        yield CounterMetricFamily(name, help_text, value=value)
    yield GaugeMetricFamily(
        "met_spec_mean_accepted_length",
        "Draft tokens accepted per sequence row that carried a draft.",
        value=spec.mean_accepted_length,
    )
    mode = GaugeMetricFamily(
        "met_spec_gate_speculating",
        "1 where the gate runs this decode width with drafts, 0 where without.",
        labels=("width",),
    )
    for bucket, width in enumerate(_WIDTHS):
        on = spec.mode == "ngram-forced" or bucket not in spec.gate_plain_buckets
        mode.add_metric((width,), int(on))
    yield mode
    off = CounterMetricFamily(
        "met_spec_requests_off",
        "Finished requests that ran without speculation, by reason.",
        labels=("reason",),
    )
    for reason in ("penalties",):
        off.add_metric((reason,), spec.requests_off.get(reason, 0))
    yield off


def _total(metric: Counter, keep: Callable[[dict[str, str]], bool] = lambda _: True) -> float:
    return sum(
        s.value
        for family in metric.collect()
        for s in family.samples
        if s.name.endswith("_total") and keep(s.labels)
    )


class ServerMetrics:
    """Everything /metrics exposes, in a registry of its own (so that several apps in one process,
    as in the tests, keep separate counts); updated on the event loop."""

    def __init__(
        self, source: StatsSource | None = None, models: ModelsSource | None = None
    ) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.requests = Counter(
            "met_requests",
            "HTTP API requests by API, status code and finish reason.",
            ("api", "code", "finish"),
            registry=reg,
        )
        self.prompt_tokens = Counter(
            "met_prompt_tokens", "Prompt tokens of admitted requests.", ("api",), registry=reg
        )
        self.generation_tokens = Counter(
            "met_generation_tokens",
            "Tokens generated and delivered to clients.",
            ("api",),
            registry=reg,
        )
        self.ttft = Histogram(
            "met_time_to_first_token_seconds",
            "Time from arrival to first token.",
            ("api",),
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            "met_inter_token_latency_seconds",
            "Time between successive tokens.",
            ("api",),
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "met_e2e_request_latency_seconds",
            "Time from arrival to last token.",
            ("api",),
            buckets=_E2E_BUCKETS,
            registry=reg,
        )
        for api in GENERATION_APIS:
            for metric in (
                self.prompt_tokens,
                self.generation_tokens,
                self.ttft,
                self.itl,
                self.e2e,
            ):
                metric.labels(api)
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        if GC_COLLECTOR is not None:  # None on interpreters without gc.get_stats
            GCCollector(registry=reg)
        reg.register(_EngineCollector(source or (lambda: (None, False)), models))

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition for an Accept header: OpenMetrics when it asks for it, else text 0.0.4."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def requests_total(self) -> int:
        return int(_total(self.requests))

    def errors_total(self) -> int:
        return int(_total(self.requests, lambda labels: int(labels["code"]) >= 400))

    def prompt_tokens_total(self) -> int:
        return int(_total(self.prompt_tokens))

    def generation_tokens_total(self) -> int:
        return int(_total(self.generation_tokens))
