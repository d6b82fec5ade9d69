"""Server settings, read in one place: flag > MET_* environment variable > TOML file > default."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from met.config import EngineConfig
from met.parallel.experts import NEEDS_RANKS

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ENV_PREFIX = "MET_"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "float32")  # met.engine.kv_budget.KV_DTYPES
TOOL_CALL_PARSERS = (  # met.chat.setup.TOOL_FORMATS, with auto and none
    "auto",
    "none",
    "hermes",
    "llama3_json",
    "mistral",
    "qwen3_coder",
    "pythonic",
    "generic",
)
REASONING_PARSERS = ("auto", "none", "qwen3", "deepseek_r1")  # met.chat.setup.REASONING_PARSERS
SPECULATIVE = ("off", "ngram", "ngram-forced")  # met.engine.core.SPECULATIVE
POOLINGS = ("none", "mean", "cls", "last", "rank")  # met.engine.pooling.POOLINGS
WEIGHT_FORMATS = (
    "auto",
    "dequantized",
    "gguf",
)  # met.models.WEIGHT_FORMATS, without importing torch


class SettingsError(ValueError):
    """A setting from the environment or the config file is malformed or out of range."""


@dataclass
class ServerSettings:
    engine: EngineConfig = field(default_factory=EngineConfig)
    served_model_name: list[str] | None = None  # '*' among them: any name is accepted
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    log_level: str = "info"
    no_tui: bool = False
    no_webui: bool = False
    request_timeout: float | None = None  # seconds per request; None: no limit
    # Larger bodies get a 413 before they are read whole: a 128k-token prompt is well under 2 MB.
    max_request_bytes: int = 16 << 20
    shutdown_grace: float = 10.0
    config: str | None = None
    tool_call_parser: str | None = None  # None/"auto": from the chat template
    reasoning_parser: str | None = None  # None/"auto": from the chat template
    max_thinking_tokens: int | None = None  # default thinking budget of a request
    # Several models behind one port (met.server.router): --model given more than once (the
    # first is engine.model, these the rest) and a folder of them.
    more_models: list[str] = field(default_factory=list)
    models_dir: str | None = None
    max_loaded_models: int = 4  # llama-server's --models-max default
    model_idle_timeout: float | None = None  # seconds unused before a model unloads
    model_load_timeout: float = 600.0  # how long a request waits for its model to load
    models_memory_gib: float | None = None  # loaded models' weights + KV pools at most


@dataclass(frozen=True)
class _Option:
    name: str  # attribute; the flag is --name-with-dashes, the variable MET_NAME
    kind: type
    help: str
    on_engine: bool = False
    choices: tuple[str, ...] | None = None
    minimum: float | None = None


_OPTIONS = (
    _Option(
        "model",
        str,
        "GGUF file, Hugging Face folder or user/repo[:QUANT] from the Hugging Face Hub "
        "(default: the default model); repeat it to serve several models",
        True,
    ),
    _Option("models_dir", str, "also serve every GGUF file and HF folder in this folder"),
    _Option(
        "max_loaded_models",
        int,
        "models loaded at once; the least recently used unloads beyond it (default 4)",
        minimum=1,
    ),
    _Option(
        "model_idle_timeout",
        float,
        "seconds a model may go unused before it unloads (default: never)",
        minimum=0,
    ),
    _Option(
        "models_memory_gib",
        float,
        "GiB the loaded models' weights and KV pools may take together; the least recently "
        "used idle one unloads beyond it (default: no limit)",
        minimum=0,
    ),
    _Option(
        "model_load_timeout",
        float,
        "seconds a request waits for its model to load before a 503 (default 600)",
        minimum=0,
    ),
    _Option(
        "served_model_name",
        list,
        "model names clients use, one or more ('*': any name, echoed back; default: the "
        "model's name)",
    ),
    _Option("host", str, "address to listen on"),
    _Option("port", int, "port to listen on", minimum=0),
    _Option(
        "api_key", str, "require 'Authorization: Bearer <key>' or 'x-api-key: <key>' (not /health)"
    ),
    _Option(
        "max_num_seqs",
        int,
        "sequences running at once (default: 8 on a CPU, 64 on a GPU)",
        True,
        minimum=1,
    ),
    _Option("max_prefill_tokens", int, "chunked-prefill chunk length (0: whole)", True, minimum=0),
    _Option("max_model_len", int, "context length (default: the model's, capped)", True, minimum=1),
    _Option(
        "kv_cache_blocks", int, "KV cache blocks (default: enough for all seqs)", True, minimum=1
    ),
    _Option(
        "gpu_memory_utilization",
        float,
        "GPU: share of its memory to use; the KV cache gets what is left",
        True,
        minimum=0,
    ),
    _Option("dtype", str, "weight and activation dtype", True, choices=DTYPES),
    _Option("device", str, "device to run on", True, choices=DEVICES),
    _Option(
        "weight_format",
        str,
        "gguf: keep quantized weights as blocks (CPU, float32); auto: gguf on the CPU",
        True,
        choices=WEIGHT_FORMATS,
    ),
    _Option("max_queue", int, "waiting requests before answering 503", True, minimum=1),
    _Option("tensor_parallel_size", int, "ranks to split the model over", True, minimum=1),
    _Option(
        "enable_expert_parallel",
        bool,
        "with --tensor-parallel-size N: split a MoE's experts over the N ranks (E/N each)",
        True,
    ),
    _Option("enforce_eager", bool, "GPU: run decode op by op instead of CUDA graphs", True),
    _Option(
        "kv_cache_dtype",
        str,
        "KV cache dtype (auto: float16 for GGUF weights on the CPU, else the model's)",
        True,
        choices=KV_CACHE_DTYPES,
    ),
    _Option(
        "tool_call_parser",
        str,
        "tool-call format (auto: from the chat template; generic for templates without tools)",
        choices=TOOL_CALL_PARSERS,
    ),
    _Option(
        "reasoning_parser",
        str,
        "split <think> reasoning off the answer (auto: when the template thinks)",
        choices=REASONING_PARSERS,
    ),
    _Option(
        "max_thinking_tokens",
        int,
        "thinking budget per request; then the end of thinking is forced (default: none)",
        minimum=0,
    ),
    _Option(
        "speculative",
        str,
        "prompt-lookup speculative decoding: ngram (gated, the default), ngram-forced, off",
        True,
        choices=SPECULATIVE,
    ),
    _Option(
        "num_speculative_tokens", int, "draft tokens verified per step at most", True, minimum=1
    ),
    _Option(
        "pooling",
        str,
        "embeddings (/v1/embeddings): mean, cls or last; rank: a yes/no reranker (/v1/rerank); "
        "none: neither (default: what the model file says)",
        True,
        choices=POOLINGS,
    ),
    _Option("log_level", str, "log verbosity", choices=LOG_LEVELS),
    _Option("no_tui", bool, "plain log lines instead of the terminal dashboard"),
    _Option("no_webui", bool, "do not serve the chat page at /"),
    _Option("request_timeout", float, "seconds a request may run (default: no limit)", minimum=0),
    _Option("max_request_bytes", int, "largest request body, bytes (413 above it)", minimum=1),
    _Option("shutdown_grace", float, "seconds to drain in-flight requests on exit", minimum=0),
)
_BY_NAME = {opt.name: opt for opt in _OPTIONS}


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every serve option; defaults stay None so that unset flags fall through to env/file."""
    parser.add_argument("--config", metavar="FILE", default=None, help="TOML file of settings")
    for opt in _OPTIONS:
        flag = "--" + opt.name.replace("_", "-")
        if opt.kind is bool:
            parser.add_argument(flag, action="store_const", const=True, default=None, help=opt.help)
        elif opt.name == "model":
            parser.add_argument(flag, action="append", default=None, metavar="MODEL", help=opt.help)
        elif opt.kind is list:
            parser.add_argument(flag, nargs="+", default=None, metavar="NAME", help=opt.help)
        else:
            parser.add_argument(
                flag, type=opt.kind, choices=opt.choices, default=None, help=opt.help
            )


def load_settings(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ServerSettings:
    """Parse `met serve` arguments (argparse exits on bad flags), then layer env and file."""
    parser = argparse.ArgumentParser(prog="met serve", description="OpenAI-compatible server")
    add_serve_arguments(parser)
    return resolve_settings(parser.parse_args(list(argv)), os.environ if env is None else env)


def resolve_settings(namespace: argparse.Namespace, env: Mapping[str, str]) -> ServerSettings:
    """Combine parsed flags with the environment and the config file; raise SettingsError."""
    config_path = namespace.config or env.get(ENV_PREFIX + "CONFIG") or None
    file_values = _read_file(config_path) if config_path else {}
    layers = [file_values, _read_env(env), _read_flags(namespace)]
    settings = ServerSettings(config=config_path)
    for layer in layers:
        more = _split_models(layer)
        if more is not None:
            settings.more_models = more
        for name, value in layer.items():
            _check(_BY_NAME[name], value)
            target = settings.engine if _BY_NAME[name].on_engine else settings
            setattr(target, name, value)
    engine = settings.engine
    if engine.enable_expert_parallel and engine.tensor_parallel_size < 2:
        raise SettingsError(NEEDS_RANKS)
    return settings


def _read_flags(namespace: argparse.Namespace) -> dict[str, Any]:
    values = {opt.name: getattr(namespace, opt.name, None) for opt in _OPTIONS}
    return {name: value for name, value in values.items() if value is not None}


def _split_models(layer: dict[str, Any]) -> list[str] | None:
    """A layer's --model values (repeatable on the command line, a list in the file): the first
    stays `model`, the rest are returned."""
    models = layer.get("model")
    if not isinstance(models, list):
        return None
    if not models or not all(isinstance(m, str) for m in models):
        raise SettingsError(f"model: expected a path or a list of paths, got {models!r}")
    layer["model"] = models[0]
    return models[1:]


def _read_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for opt in _OPTIONS:
        raw = env.get(ENV_PREFIX + opt.name.upper(), "")
        if raw != "":
            values[opt.name] = _parse_text(opt, raw, ENV_PREFIX + opt.name.upper())
    return values


def _parse_text(opt: _Option, raw: str, source: str) -> Any:
    if opt.kind is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{source}: expected a boolean, got {raw!r}")
    if opt.kind is list:
        return [name for name in raw.replace(",", " ").split() if name]
    try:
        return opt.kind(raw)
    except ValueError:
        raise SettingsError(f"{source}: expected {opt.kind.__name__}, got {raw!r}") from None


def _read_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise SettingsError(f"--config: cannot read {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"--config: {path} is not valid TOML: {e}") from None
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in _BY_NAME:
            raise SettingsError(f"{path}: unknown setting {key!r}")
        if name == "model" and isinstance(value, list):
            values[name] = value  # several models: checked by _split_models
            continue
        values[name] = _coerce_file_value(_BY_NAME[name], value, f"{path}: {key}")
    return values


def _coerce_file_value(opt: _Option, value: Any, source: str) -> Any:
    # TOML has real types; only an int where a float is wanted is a safe widening.
    if opt.kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if opt.kind is list and isinstance(value, str):
        return [value]
    if opt.kind is list and not all(isinstance(v, str) for v in value or [None]):
        raise SettingsError(f"{source}: expected a name or a list of names, got {value!r}")
    if isinstance(value, bool) != (opt.kind is bool) or not isinstance(value, opt.kind):
        raise SettingsError(f"{source}: expected {opt.kind.__name__}, got {value!r}")
    return value


def _check(opt: _Option, value: Any) -> None:
    if opt.choices is not None and value not in opt.choices:
        raise SettingsError(f"{opt.name}: must be one of {', '.join(opt.choices)}, got {value!r}")
    if opt.minimum is not None and value < opt.minimum:
        raise SettingsError(f"{opt.name}: must be at least {opt.minimum:g}, got {value}")
    if opt.name == "port" and value > 65535:
        raise SettingsError(f"port: must be at most 65535, got {value}")
