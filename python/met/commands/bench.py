"""`met bench`: measure latency and throughput of any OpenAI-compatible server."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from met.commands.bench_load import LoadPlan, run_load, synthetic_prompts
from met.commands.bench_stats import RequestResult, format_report, summarize
from met.commands.common import CliError, SubParsers, add_command

DEFAULT_NUM_REQUESTS = 32
DEFAULT_CONCURRENCY = 4


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    parser = add_command(
        subparsers,
        common,
        "bench",
        "load-test an OpenAI-compatible server with streaming chat requests",
        epilog="Requests use temperature 0 and max_tokens=--output-len; output token counts are "
        "the server's own usage figures, since a model may stop before --output-len.",
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    parser.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    parser.add_argument(
        "--concurrency",
        type=_positive(int),
        help=f"most requests in flight (default {DEFAULT_CONCURRENCY}; no cap with --request-rate)",
    )
    parser.add_argument(
        "--request-rate", type=_positive(float), help="Poisson arrivals, requests per second"
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--prompt-len", type=_positive(int), default=128, help="synthetic prompt words"
    )
    source.add_argument(
        "--prompts-file", type=Path, help="one prompt a line (text, or JSON with 'prompt')"
    )
    parser.add_argument(
        "--output-len", type=_positive(int), default=64, help="max_tokens per request"
    )
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--num-requests", type=_positive(int), help=f"default {DEFAULT_NUM_REQUESTS}")
    stop.add_argument("--duration", type=_positive(float), help="seconds to keep sending")
    parser.add_argument(
        "--warmup", type=_non_negative_int, default=0, help="uncounted first requests"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for prompts and arrivals")
    parser.add_argument("--timeout", type=_positive(float), default=600.0, help="per request, s")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    parser.set_defaults(func=_run)


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def normalize_url(url: str) -> str:
    url = url.rstrip("/")
    return url.removesuffix("/v1") if url.endswith("/v1") else url


def _run(args: argparse.Namespace) -> int:
    base_url = normalize_url(args.url)
    model = args.model or discover_model(base_url)
    plan = LoadPlan(
        base_url=base_url,
        model=model,
        prompts=_prompts(args),
        output_len=args.output_len,
        concurrency=args.concurrency or (None if args.request_rate else DEFAULT_CONCURRENCY),
        request_rate=args.request_rate,
        num_requests=None if args.duration else args.num_requests or DEFAULT_NUM_REQUESTS,
        duration=args.duration,
        seed=args.seed,
        timeout=args.timeout,
    )
    if args.warmup:
        warmup = dataclasses.replace(
            plan, num_requests=args.warmup, duration=None, request_rate=None
        )
        asyncio.run(run_load(warmup, lambda _: None))
    progress = Progress(plan.num_requests, plan.duration)
    results, duration = asyncio.run(run_load(plan, progress.update))
    progress.finish()
    summary = summarize(results, duration)
    summary.update(model=model, url=base_url, warmup_requests=args.warmup)
    print(json.dumps(_json_safe(summary)) if args.json else format_report(summary))
    if results and summary["completed"] == 0:
        raise CliError(f"every request failed, e.g. {summary['error_samples'][0]}")
    return 0


def discover_model(base_url: str) -> str:
    """The first served model; doubles as the check that the server is there at all."""
    try:
        response = httpx.get(f"{base_url}/v1/models", timeout=10.0)
        response.raise_for_status()
        models = response.json().get("data", [])
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach {base_url}: {exc}") from exc
    if not models:
        raise CliError(f"{base_url}/v1/models lists no model; pass --model")
    return str(models[0]["id"])


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.prompts_file is None:
        count = args.num_requests or DEFAULT_NUM_REQUESTS
        return synthetic_prompts(min(count, 1024), args.prompt_len, args.seed)
    try:
        lines = args.prompts_file.read_text().splitlines()
    except OSError as exc:
        raise CliError(f"cannot read prompts file: {exc}") from exc
    prompts = [_prompt_of(line) for line in lines if line.strip()]
    if not prompts:
        raise CliError(f"{args.prompts_file} holds no prompt")
    return prompts


def _prompt_of(line: str) -> str:
    if line.lstrip().startswith("{"):
        try:
            return str(json.loads(line)["prompt"])
        except (json.JSONDecodeError, KeyError) as exc:
            raise CliError(f"bad prompts-file line {line[:60]!r}: {exc}") from exc
    return line


def _json_safe(value: Any) -> Any:
    # JSON has no NaN; a figure with no samples (e.g. ITL of one-token answers) becomes null.
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    return value


class Progress:
    """A one-line progress bar on stderr; a plain line every few seconds when not a terminal."""

    WIDTH = 30

    def __init__(self, total: int | None, duration: float | None) -> None:
        self.total, self.duration = total, duration
        self.start = time.monotonic()
        self.done = self.errors = 0
        self.last_print = 0.0
        self.tty = sys.stderr.isatty()

    def update(self, result: RequestResult) -> None:
        self.done += 1
        self.errors += not result.ok
        now = time.monotonic()
        if now - self.last_print >= (0.2 if self.tty else 5.0):
            self.last_print = now
            self._print(now)

    def finish(self) -> None:
        self._print(time.monotonic())
        if self.tty:
            print(file=sys.stderr)

    def _print(self, now: float) -> None:
        elapsed = now - self.start
        fraction = self.done / self.total if self.total else elapsed / (self.duration or 1)
        filled = int(self.WIDTH * min(fraction, 1.0))
        bar = "#" * filled + "." * (self.WIDTH - filled)
        count = f"{self.done}/{self.total}" if self.total else f"{self.done} in {elapsed:.0f}s"
        rate = self.done / max(elapsed, 1e-9)
        line = f"bench [{bar}] {count}  {rate:.2f} req/s  {self.errors} errors"
        print(
            f"\r{line}" if self.tty else line,
            end="" if self.tty else "\n",
            file=sys.stderr,
            flush=True,
        )
