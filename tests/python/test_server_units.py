"""Pure tests of the server's pieces: settings precedence, SSE framing, metrics, error mapping."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from met.engine.outputs import EngineStats, SpecStats
from met.server.body import parse_body
from met.server.errors import APIError, from_value_error, location_to_param
from met.server.generation import fit_max_tokens
from met.server.metrics import ServerMetrics, api_label
from met.server.protocol import ChatCompletionBody, CompletionBody, sampling_params
from met.server.settings import SettingsError, load_settings
from met.server.state import ServerState
from met.server.streaming import SSE_DONE, Envelope, sse


def test_settings_defaults() -> None:
    s = load_settings([], env={})
    assert (s.host, s.port, s.api_key, s.shutdown_grace, s.request_timeout) == (
        "127.0.0.1",
        8000,
        None,
        10.0,
        None,
    )
    assert s.engine.model is None and s.engine.max_queue == 256


def test_settings_precedence_flag_over_env_over_file(tmp_path) -> None:
    config = tmp_path / "met.toml"
    config.write_text('port = 9001\nmax-num-seqs = 3\napi_key = "from-file"\nshutdown_grace = 2\n')
    env = {"MET_CONFIG": str(config), "MET_PORT": "9002", "MET_NO_TUI": "yes"}
    s = load_settings(["--port", "9003"], env=env)
    assert s.port == 9003  # flag beats env and file
    assert s.engine.max_num_seqs == 3  # file, nothing above it
    assert s.api_key == "from-file"
    assert s.shutdown_grace == 2.0 and isinstance(s.shutdown_grace, float)
    assert s.no_tui is True
    assert load_settings([], env=env).port == 9002  # env beats file
    assert load_settings(["--config", str(config)], env={}).port == 9001


def test_settings_weight_format_reaches_the_engine() -> None:
    assert load_settings([], env={}).engine.weight_format == "auto"
    assert load_settings(["--weight-format", "gguf"], env={}).engine.weight_format == "gguf"
    assert load_settings([], env={"MET_WEIGHT_FORMAT": "gguf"}).engine.weight_format == "gguf"


def test_settings_speculation_reaches_the_engine() -> None:
    engine = load_settings([], env={}).engine
    assert (engine.speculative, engine.num_speculative_tokens) == ("ngram", 4)
    argv = ["--speculative", "off", "--num-speculative-tokens", "6"]
    engine = load_settings(argv, env={}).engine
    assert (engine.speculative, engine.num_speculative_tokens) == ("off", 6)
    with pytest.raises(SystemExit):
        load_settings(["--speculative", "eagle"], env={})


@pytest.mark.parametrize(
    ("env", "content"),
    [
        ({"MET_PORT": "eighty"}, None),
        ({"MET_PORT": "70000"}, None),
        ({"MET_NO_TUI": "maybe"}, None),
        ({"MET_DTYPE": "int4"}, None),
        ({"MET_WEIGHT_FORMAT": "q4"}, None),
        ({"MET_MAX_NUM_SEQS": "0"}, None),
        ({}, "colour = 'blue'\n"),
        ({}, "port = '8000'\n"),
        ({}, "port = [\n"),
    ],
)
def test_settings_errors(tmp_path, env: dict[str, str], content: str | None) -> None:
    argv = []
    if content is not None:
        config = tmp_path / "bad.toml"
        config.write_text(content)
        argv = ["--config", str(config)]
    with pytest.raises(SettingsError):
        load_settings(argv, env=env)


def test_sse_framing_keeps_unicode() -> None:
    assert sse({"text": "é😀"}) == 'data: {"text":"é😀"}\n\n'.encode()
    assert SSE_DONE == b"data: [DONE]\n\n"
    envelope = Envelope("id-1", "text_completion", "m", include_usage=True, created=5)
    assert envelope.chunk([])["usage"] is None
    assert envelope.usage_chunk({"total_tokens": 3}) == {
        "id": "id-1",
        "object": "text_completion",
        "created": 5,
        "model": "m",
        "choices": [],
        "usage": {"total_tokens": 3},
    }


def _samples(metrics: ServerMetrics) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metrics.registry.collect()
        for s in family.samples
    }


def test_metrics_names_and_standard_collectors() -> None:
    text, content_type = ServerMetrics().render(None)
    assert content_type.startswith("text/plain; version=0.0.4")
    text = text.decode()
    for name in (
        "# TYPE met_requests_total counter",
        "# TYPE met_time_to_first_token_seconds histogram",
        "# TYPE met_inter_token_latency_seconds histogram",
        "# TYPE met_e2e_request_latency_seconds histogram",
        "met_ready 0.0",
        "met_num_requests_running 0.0",
        "met_kv_blocks_used 0.0",
        "met_prefix_cache_hit_rate 0.0",
        "process_resident_memory_bytes",
        "process_open_fds",
        "python_info{",
        'met_inter_token_latency_seconds_count{api="chat"} 0.0',
        'met_generation_tokens_total{api="completions"} 0.0',
    ):
        assert name in text
    assert text.endswith("\n")


def test_metrics_openmetrics_when_asked() -> None:
    body, content_type = ServerMetrics().render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.decode().endswith("# EOF\n")


def test_metrics_by_api_and_one_registry_per_app() -> None:
    first, second = ServerMetrics(), ServerMetrics()
    first.ttft.labels(api_label("/v1/chat/completions")).observe(0.05)
    first.requests.labels("completions", "200", "stop").inc()
    first.requests.labels("chat", "400", "").inc(2)
    first.generation_tokens.labels("chat").inc(7)
    samples = _samples(first)
    assert samples[("met_time_to_first_token_seconds_count", (("api", "chat"),))] == 1
    assert (
        samples[("met_time_to_first_token_seconds_bucket", (("api", "chat"), ("le", "0.05")))] == 1
    )
    assert (first.requests_total(), first.errors_total(), first.generation_tokens_total()) == (
        3,
        2,
        7,
    )
    assert (second.requests_total(), second.generation_tokens_total()) == (0, 0)


def test_metrics_engine_gauges_read_at_scrape_time() -> None:
    stats = EngineStats(num_running=2, kv_blocks_used=3, kv_blocks_total=12, preemptions=5)
    samples = _samples(ServerMetrics(lambda: (stats, True)))
    assert samples[("met_ready", ())] == 1 and samples[("met_num_requests_running", ())] == 2
    assert samples[("met_kv_cache_usage_ratio", ())] == 0.25
    assert samples[("met_num_preemptions_total", ())] == 5


def test_metrics_for_routers_per_model_and_prefix_counters() -> None:
    # The gauges an llm-d / Gateway API Inference Extension endpoint picker reads (docs/server.md).
    busy = EngineStats(num_running=1, num_waiting=4, kv_blocks_used=8, kv_blocks_total=32)
    busy.kv_block_size, busy.prefix_cache_queried_tokens, busy.prefix_cache_hit_tokens = 16, 90, 60
    models = [("coder", "loaded", busy), ("small", "unloaded", None)]
    samples = _samples(ServerMetrics(lambda: (busy, True), lambda: models))
    assert samples[("met_prefix_cache_queries_total", ())] == 90
    assert samples[("met_prefix_cache_hits_total", ())] == 60
    shape = (("block_size", "16"), ("model", "coder"), ("num_blocks", "32"))
    assert samples[("met_cache_config_info", shape)] == 1
    assert samples[("met_model_requests_waiting", (("model", "coder"),))] == 4
    assert samples[("met_model_kv_cache_usage_ratio", (("model", "coder"),))] == 0.25
    assert samples[("met_model_state", (("model", "small"), ("state", "unloaded")))] == 1
    assert samples[("met_model_state", (("model", "small"), ("state", "loaded")))] == 0
    assert not any(k[0] == "met_cache_config_info" and ("model", "small") in k[1] for k in samples)


def test_metrics_speculation_only_when_on() -> None:
    assert ("met_spec_draft_tokens_total", ()) not in _samples(
        ServerMetrics(lambda: (EngineStats(), True))
    )
    spec = SpecStats(
        mode="ngram",
        drafted=40,
        accepted=30,
        verify_steps=9,
        verify_rows=10,
        withheld=7,
        gate_switches=1,
        gate_plain_buckets=[3],
        requests_off={"penalties": 2},
    )
    samples = _samples(ServerMetrics(lambda: (EngineStats(speculation=spec), True)))
    assert samples[("met_spec_draft_tokens_total", ())] == 40
    assert samples[("met_spec_accepted_tokens_total", ())] == 30
    assert samples[("met_spec_verify_steps_total", ())] == 9
    assert samples[("met_spec_withheld_tokens_total", ())] == 7
    assert samples[("met_spec_mean_accepted_length", ())] == 3.0
    assert samples[("met_spec_gate_switches_total", ())] == 1
    assert samples[("met_spec_gate_speculating", (("width", "1"),))] == 1
    assert samples[("met_spec_gate_speculating", (("width", "5-8"),))] == 0
    assert samples[("met_spec_requests_off_total", (("reason", "penalties"),))] == 2


def test_api_labels() -> None:
    assert api_label("/v1/chat/completions") == api_label("/chat/completions") == "chat"
    assert api_label("/v1/completions") == "completions"
    assert api_label("/v1/messages") == "messages" and api_label("/v1/responses") == "responses"
    assert api_label("/v1/requests/cmpl-1/cancel") == "requests"
    assert api_label("/v1/responses/resp_1") == "responses"
    assert api_label("/v1/messages/count_tokens") == "count_tokens"
    assert api_label("/no/such/route") == "other"


def test_error_params() -> None:
    assert location_to_param(("messages", 0, "content", "str")) == "messages[0].content"
    assert location_to_param(("prompt", "list[int]", 3)) == "prompt"
    err = from_value_error(ValueError("top_p: must be in (0, 1]"))
    assert (err.status, err.param, err.code) == (400, "top_p", None)
    err = from_value_error(ValueError("prompt: maximum context length is 8 tokens, prompt has 9"))
    assert err.code == "context_length_exceeded"


def test_max_tokens_clamped_to_context() -> None:
    assert fit_max_tokens(10, 100, 64, "prompt") == 54
    assert fit_max_tokens(10, None, 64, "prompt") == 54
    assert fit_max_tokens(10, 5, 64, "prompt") == 5
    with pytest.raises(APIError) as info:
        fit_max_tokens(64, 5, 64, "prompt")
    assert info.value.code == "context_length_exceeded" and "64" in info.value.message


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"prompt": "x", "max_tokens": "5"}', "max_tokens"),
        (b'{"prompt": "x", "temperature": NaN}', "temperature"),
        (b'{"prompt": "x", "stream": 1}', "stream"),
        (b'{"prompt": 3}', "prompt"),
        (b'{"prompt": "x", "n": 1000}', "n"),
        (b'{"prompt": "x", "logit_bias": {"abc": 1}}', "logit_bias"),
        (b'{"prompt": "x", "stop": ""}', "stop"),
        (b'{"prompt": "x", "top_p": 0}', "top_p"),
        (b'{"prompt": "x", "max_tokens": 9223372036854775808}', "max_tokens"),
        (b'{"prompt": "x", "top_k": -9223372036854775809}', "top_k"),
        (b'{"prompt": "x", "prompt_logprobs": 9223372036854775808}', "prompt_logprobs"),
        (b'{"prompt": [1, 18446744073709551616]}', "prompt[1]"),
        (b'{"prompt": "x", "stream_options": {"include_usage": true}}', "stream_options"),
        (b'{"prompt": "x", "stream": false, "stream_options": {}}', "stream_options"),
    ],
)
def test_completion_body_rejections(raw: bytes, param: str) -> None:
    with pytest.raises(APIError) as info:
        body = parse_body(raw, CompletionBody)
        sampling_params(body, body.max_tokens, body.logprobs)
    assert info.value.status == 400 and info.value.param == param


def test_int64_bounds_are_inclusive() -> None:
    body = parse_body(
        b'{"prompt": "x", "max_tokens": 9223372036854775807, "seed": -9223372036854775808}',
        CompletionBody,
    )
    assert sampling_params(body, body.max_tokens, None).max_tokens == 2**63 - 1
    body = parse_body(
        b'{"prompt": "x", "stream": true, "stream_options": {"include_usage": true}}',
        CompletionBody,
    )
    assert body.include_usage


def test_chat_body_accepts_content_parts() -> None:
    raw = b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}'
    body = parse_body(raw, ChatCompletionBody)
    assert body.messages[0].content[0].text == "hi"
    params = sampling_params(body, None, None)
    assert params.max_tokens is None and params.temperature == 1.0


def test_several_models_from_flags_and_file(tmp_path) -> None:
    s = load_settings(["--model", "a.gguf", "--model", "b", "--max-loaded-models", "2"], env={})
    assert (s.engine.model, s.more_models, s.max_loaded_models) == ("a.gguf", ["b"], 2)
    config = tmp_path / "met.toml"
    config.write_text('model = ["x.gguf", "y.gguf"]\nmodel-idle-timeout = 30\n')
    s = load_settings(["--config", str(config)], env={})
    assert (s.engine.model, s.more_models, s.model_idle_timeout) == ("x.gguf", ["y.gguf"], 30.0)
    with pytest.raises(SettingsError):
        load_settings(["--max-loaded-models", "0"], env={})


def _unloaded(config, progress) -> SimpleNamespace:
    return SimpleNamespace(ready=False, config=config)


def test_models_are_named_by_file_and_two_of_one_name_are_refused(tmp_path) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "tiny.Q8_0.gguf").write_bytes(b"")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    first, second = str(tmp_path / "a" / "tiny.Q8_0.gguf"), str(tmp_path / "b" / "tiny.Q8_0.gguf")
    settings = load_settings(["--model", first, "--model", str(tmp_path / "hf")], env={})
    state = ServerState(None, settings, make_engine=_unloaded)
    assert [m.names for m in state.router.models] == [["tiny"], ["hf"]]
    assert state.router.find("hf") is state.router.models[1]
    assert state.router.find(None) is state.default
    with pytest.raises(APIError) as e:
        state.router.find("other")
    assert e.value.status == 404 and "'tiny', 'hf'" in e.value.message
    with pytest.raises(ValueError, match="two models answer to 'tiny'"):
        ServerState(
            None,
            load_settings(["--model", first, "--model", second], env={}),
            None,
            make_engine=_unloaded,
        )


def test_a_model_named_only_once_loaded_answers_503_while_it_loads() -> None:
    """The default model's name comes from its file: asked for by name before it has loaded, it
    is a 503 "still loading", not a 404 listing no model."""
    state = ServerState(None, load_settings([], env={}), make_engine=_unloaded)
    with pytest.raises(APIError) as e:
        state.router.find("SmolLM2-135M-Instruct")
    assert (e.value.status, e.value.code) == (503, "model_loading")
    state.default.engine.ready, state.default.engine.model_name = True, "SmolLM2"
    state.default.status = "loaded"
    with pytest.raises(APIError) as e:
        state.router.find("other")
    assert e.value.status == 404 and "'SmolLM2'" in e.value.message


class _FakeEngine:
    """An engine whose model takes 1 GiB of weights and 0.25 GiB of KV once loaded."""

    def __init__(self, config, progress) -> None:
        self.config, self.ready, self.dead = config, False, None
        self.capacity = SimpleNamespace(weights_bytes=2**30, kv_tokens=2**20, kv_token_bytes=256)

    @property
    def model_name(self) -> str:
        return Path(self.config.model).stem

    def load(self) -> None:
        self.ready = True

    async def shutdown(self, grace_s: float) -> None:
        self.ready = False

    def stats(self) -> EngineStats:
        return EngineStats()


def test_loading_a_model_unloads_the_least_recently_used_idle_one_beyond_the_budget(
    tmp_path,
) -> None:
    argv = ["--models-memory-gib", "2.6"]
    for name in ("a", "b", "c"):
        with open(tmp_path / f"{name}.gguf", "wb") as f:
            f.truncate(2**30)  # sparse: a 1 GiB file, its size before it loads
        argv += ["--model", str(tmp_path / f"{name}.gguf")]
    state = ServerState(None, load_settings(argv, env={}), make_engine=_FakeEngine)
    a, b, c = state.router.models
    a.load_blocking()  # the server's startup load

    async def use(name: str) -> str:
        return (await state.router.acquire(name, None)).name

    async def scenario() -> list[dict[str, str]]:
        seen = []
        for name, lease in (("b", None), ("c", None), ("a", b), ("c", None)):
            if lease is not None:
                lease.leases += 1  # b is busy: it may not be unloaded
            assert await use(name) == name
            seen.append({m.name: m.status for m in state.router.models})
        return seen

    assert asyncio.run(scenario()) == [
        {"a": "loaded", "b": "loaded", "c": "unloaded"},  # 2.5 GiB fit
        {"a": "unloaded", "b": "loaded", "c": "loaded"},  # a was the least recently used
        {"a": "loaded", "b": "loaded", "c": "unloaded"},  # b busy: c goes
        {"a": "unloaded", "b": "loaded", "c": "loaded"},
    ]
