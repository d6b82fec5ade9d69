"""`met serve` beside a peer server (llama-cpp-python's, or any OpenAI-compatible URL) under load.

Each server in turn, alone on the machine: start it, wait until it answers, load it with
`met bench`'s load generator (streaming chat, temperature 0, --output-len tokens at most) at each
--concurrency level, read its peak RSS (VmHWM of the server and its children), stop it. Prints
one table: output tokens/s, TTFT and inter-token latency p50/p90, requests ok/failed, peak RSS,
and met over the peer for throughput and RSS. Beside that short-prompt load, a long-prompt load
(--long-prompt-len words, about 4k tokens: what an agent client's first request looks like) at
each --long-concurrency level measures TTFT under long prefills. Never asserts.

    PYTHONPATH=python python benchmarks/serving.py [--model FILE] [--json FILE]
    python benchmarks/serving.py --peer-url http://127.0.0.1:8080 --peer-name llama-server \\
        [--peer-pid PID]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _servers import Server, llama_cpp_server, met_server, peak_rss, running

from met.commands.bench import _json_safe, discover_model
from met.commands.bench_load import LoadPlan, run_load, synthetic_prompts
from met.commands.bench_stats import RequestResult, summarize
from met.models import resolve_model


def _requests_for(concurrency: int, fixed: int | None) -> int:
    return fixed if fixed is not None else max(2 * concurrency, 8)


def _load(
    server: Server, model: str, concurrency: int, args: argparse.Namespace, long: bool = False
) -> dict:
    """One load level: met bench's figures, plus output tokens counted from streamed chunks."""
    count = _requests_for(concurrency, args.num_requests)
    if long:
        count = args.long_requests or max(2 * concurrency, 4)
    prompt_len = args.long_prompt_len if long else args.prompt_len
    plan = LoadPlan(
        base_url=server.url,
        model=model,
        prompts=synthetic_prompts(count, prompt_len, seed=concurrency + (1000 if long else 0)),
        output_len=args.long_output_len if long else args.output_len,
        concurrency=concurrency,
        request_rate=None,
        num_requests=count,
        duration=None,
        timeout=args.timeout,
    )
    results, duration = asyncio.run(run_load(plan, lambda _: None))
    summary = summarize(results, duration)
    summary["concurrency"] = concurrency
    summary["load"] = "long" if long else "short"
    _add_chunk_count(summary, results, duration)
    return _json_safe(summary)


def _add_chunk_count(summary: dict, results: list[RequestResult], duration: float) -> None:
    # Some servers (llama-cpp-python) send no usage in a stream; then the output is counted as
    # content chunks, one token each on those servers.
    chunks = sum(1 + len(r.token_gaps) for r in results if r.ok and r.ttft is not None)
    summary["output_chunks"] = chunks
    if summary["output_tokens"] == 0 and chunks:
        summary["output_tokens"] = chunks
        summary["output_token_throughput"] = chunks / max(duration, 1e-9)
        summary["output_tokens_source"] = "chunks"
    else:
        summary["output_tokens_source"] = "usage"


def _warm_up(server: Server, model: str, args: argparse.Namespace) -> None:
    if args.warmup:
        plan = LoadPlan(
            base_url=server.url,
            model=model,
            prompts=synthetic_prompts(args.warmup, args.prompt_len, seed=999),
            output_len=min(args.output_len, 16),
            concurrency=1,
            request_rate=None,
            num_requests=args.warmup,
            duration=None,
            timeout=args.timeout,
        )
        asyncio.run(run_load(plan, lambda _: None))


def _bench_server(server: Server, args: argparse.Namespace, log_dir: Path) -> dict:
    """Start (or reach) one server, run every load level on it, read its peak RSS, stop it."""
    log_path = log_dir / f"{server.name}.log"
    started = time.monotonic()
    with running(server, log_path, args.startup_timeout):
        print(f"{server.name}: ready at {server.url} after {time.monotonic() - started:.0f} s")
        model = discover_model(server.url)
        _warm_up(server, model, args)
        levels = []
        for concurrency in args.concurrency:
            level = _load(server, model, concurrency, args)
            levels.append(level)
            print(f"{server.name} c={concurrency}: {_one_line(level)}", flush=True)
        for concurrency in args.long_concurrency:
            level = _load(server, model, concurrency, args, long=True)
            levels.append(level)
            print(f"{server.name} long c={concurrency}: {_one_line(level)}", flush=True)
        rss = peak_rss(server.pid) if server.pid is not None else None
    return {
        "name": server.name,
        "url": server.url,
        "command": server.command,
        "env": server.env,
        "log": str(log_path) if server.command else None,
        "served_model": model,
        "levels": levels,
        "peak_rss": rss,
    }


def _one_line(level: dict) -> str:
    ttft, itl = level["ttft_s"], level["itl_s"]
    return (
        f"{level['output_token_throughput']:.1f} tok/s, ttft p50 {_ms(ttft['p50'])} ms, "
        f"itl p50 {_ms(itl['p50'])} ms, {level['completed']} ok, {level['errors']} failed"
        + (f" ({level['error_samples'][0]})" if level["error_samples"] else "")
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def _mib(engine: dict) -> float | None:
    rss = engine.get("peak_rss")
    return None if rss is None else rss["total_mib"]


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if not ours or not theirs else ours / theirs


def _ratios(engines: list[dict]) -> dict[str, Any]:
    met = next((e for e in engines if e["name"] == "met"), None)
    peer = next((e for e in engines if e["name"] != "met"), None)
    if met is None or peer is None:
        return {}
    ratios: dict[str, Any] = {"peer": peer["name"], "peak_rss": _ratio(_mib(met), _mib(peer))}
    theirs = {(lv["load"], lv["concurrency"]): lv for lv in peer["levels"]}
    for level in met["levels"]:
        key = (level["load"], level["concurrency"])
        peer_level = theirs.get(key, {})
        ratios[_ratio_key(*key)] = _ratio(
            level["output_token_throughput"], peer_level.get("output_token_throughput")
        )
        ratios[_ratio_key(*key, "ttft")] = _ratio(
            level["ttft_s"]["p50"], (peer_level.get("ttft_s") or {}).get("p50")
        )
    return ratios


def _ratio_key(load: str, concurrency: int, what: str = "throughput") -> str:
    return f"{what}_c{concurrency}" + ("_long" if load == "long" else "")


def _print_table(engines: list[dict], ratios: dict[str, Any]) -> None:
    print(
        "| engine | load | concurrency | output tok/s | met/peer | TTFT p50 / p90 ms "
        "| TTFT met/peer | ITL p50 / p90 ms | ok / failed | peak RSS MiB |"
    )
    print("|---" * 10 + "|")
    for engine in engines:
        rss = _mib(engine)
        for level in engine["levels"]:
            c, load = level["concurrency"], level["load"]
            is_met = engine["name"] == "met"
            ratio = ratios.get(_ratio_key(load, c)) if is_met else None
            ttft_ratio = ratios.get(_ratio_key(load, c, "ttft")) if is_met else None
            ttft, itl = level["ttft_s"], level["itl_s"]
            cells = [
                engine["name"] + ("" if level["output_tokens_source"] == "usage" else " *"),
                load,
                str(c),
                f"{level['output_token_throughput']:.1f}",
                "-" if ratio is None else f"{ratio:.2f}x",
                f"{_ms(ttft['p50'])} / {_ms(ttft['p90'])}",
                "-" if ttft_ratio is None else f"{ttft_ratio:.2f}x",
                f"{_ms(itl['p50'])} / {_ms(itl['p90'])}",
                f"{level['completed']} / {level['errors']}",
                "-" if rss is None else f"{rss:.0f}",
            ]
            print("| " + " | ".join(cells) + " |")
    if ratios.get("peak_rss") is not None:
        print(f"peak RSS met / {ratios['peer']}: {ratios['peak_rss']:.2f}x (target <= 1.5x)")
    if any(lv["output_tokens_source"] == "chunks" for e in engines for lv in e["levels"]):
        print("* no usage in the stream: output tokens counted as content chunks")


def _servers(args: argparse.Namespace, model: str) -> list[Server]:
    servers = []
    if "met" in args.engines:
        seqs = args.met_max_num_seqs or max(args.concurrency)
        extra = shlex.split(args.met_args)
        servers.append(met_server(model, args.met_port, args.threads, seqs, extra))
    if "peer" in args.engines:
        if args.peer_url:
            name = args.peer_name or "peer"
            servers.append(Server(name, args.peer_url.rstrip("/"), pid=args.peer_pid))
        else:
            extra = shlex.split(args.peer_args)
            if args.long_concurrency and "--n_ctx" not in extra:
                extra += ["--n_ctx", "8192"]  # its default (2048) refuses the long prompts
            servers.append(llama_cpp_server(model, args.peer_port, args.threads, extra))
            if args.peer_name:
                servers[-1].name = args.peer_name
    return servers


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--model", default=None, help="GGUF file (default: the default model)")
    add("--threads", type=int, default=os.cpu_count(), help="threads for both servers")
    add("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    add("--num-requests", type=int, default=None, help="per level (default max(2c, 8))")
    add("--output-len", type=int, default=128, help="max_tokens per request")
    add("--prompt-len", type=int, default=128, help="synthetic prompt words")
    add("--long-prompt-len", type=int, default=4000, help="long-load prompt words (~1 token each)")
    add("--long-concurrency", type=int, nargs="*", default=[1, 4], help="long-load levels")
    add("--long-output-len", type=int, default=16, help="max_tokens per long-load request")
    add("--long-requests", type=int, default=None, help="per long level (default max(2c, 4))")
    add("--warmup", type=int, default=2, help="uncounted short requests per server")
    add("--timeout", type=float, default=600.0, help="per request, s")
    add("--startup-timeout", type=float, default=600.0, help="seconds a server may take to start")
    add("--engines", nargs="+", choices=["met", "peer"], default=["met", "peer"])
    add("--met-port", type=int, default=8601)
    add("--met-max-num-seqs", type=int, default=None, help="default: the largest concurrency")
    add("--met-args", default="", help="more `met serve` flags, e.g. --met-args='--dtype bfloat16'")
    add("--peer-url", default=None, help="a running OpenAI-compatible server to use as the peer")
    add("--peer-name", default=None, help="its name in the table")
    add("--peer-pid", type=int, default=None, help="its process id, to read its peak RSS")
    add("--peer-port", type=int, default=8602, help="for the llama-cpp-python server started here")
    add("--peer-args", default="", help="more llama_cpp.server flags, e.g. '--n_ctx 4096'")
    add("--log-dir", type=Path, default=None, help="server logs (default: a temporary folder)")
    add("--json", metavar="FILE", default=None, help="write the raw figures")
    return parser.parse_args()


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    args = _parse_args()
    signal.signal(signal.SIGTERM, _interrupt)  # stop the servers on a kill too, not only Ctrl+C
    model = str(resolve_model(args.model))
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="met-serving-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"model {model}; {args.threads} threads; concurrency {args.concurrency}; "
        f"output-len {args.output_len}; prompt-len {args.prompt_len}; logs in {log_dir}"
    )
    engines = []
    for server in _servers(args, model):
        try:
            engines.append(_bench_server(server, args, log_dir))
        except (RuntimeError, TimeoutError, OSError) as exc:
            print(f"{server.name}: not measured: {exc}")
    ratios = _ratios(engines)
    _print_table(engines, ratios)
    if args.json:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        report = {"model": model, "settings": settings, "engines": engines, "ratios": ratios}
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted; servers stopped", file=sys.stderr)
        sys.exit(130)
