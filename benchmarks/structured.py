"""Structured output's cost: aggregate output tok/s of N concurrent requests under a JSON schema
against N unconstrained requests of the same lengths, in one run of `met serve`.

Each round sends N schema-constrained chat requests at once (seeded, temperature 1, the same
prompt), records each one's completion length, then sends N unconstrained requests with
`ignore_eos` and `max_tokens` set to those lengths, so both write the same number of tokens in
the same batch shapes, then the constrained ones again (same seeds, same lengths; the two
timings are averaged). Each round is printed, then the medians (the machine may be noisy).
With --llama-server PATH the same schema also goes through llama-server's `json_schema` field
(constrained requests only, for its tok/s beside met's).

    PYTHONPATH=python python benchmarks/structured.py            # default model, 8 requests
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _servers import Server, met_server, running

from met.models import resolve_model

SCHEMA = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "minItems": 10,
            "maxItems": 10,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Z][a-z]{2,8}$"},
                    "age": {"type": "integer", "minimum": 18, "maximum": 99},
                    "city": {"enum": ["Paris", "Lyon", "Berlin", "Madrid", "Rome"]},
                },
                "required": ["name", "age", "city"],
            },
        }
    },
    "required": ["people"],
}
MESSAGES = [{"role": "user", "content": "List ten people with their name, age and city."}]


async def _round(url: str, bodies: list[dict], timeout: float) -> tuple[list[int], float]:
    """Sends the bodies at once; returns each answer's completion tokens and the wall time."""
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:

        async def one(body: dict) -> int:
            response = await client.post("/v1/chat/completions", json=body)
            response.raise_for_status()
            return response.json()["usage"]["completion_tokens"]

        start = time.perf_counter()
        lengths = await asyncio.gather(*(one(b) for b in bodies))
        return list(lengths), time.perf_counter() - start


def _constrained(n: int, seed: int, field: str, max_tokens: int) -> list[dict]:
    shape = {"type": "json_schema", "json_schema": {"name": "people", "schema": SCHEMA}}
    extra = {"response_format": shape} if field == "response_format" else {"json_schema": SCHEMA}
    return [
        {"messages": MESSAGES, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed + i}
        | extra
        for i in range(n)
    ]


def _plain(lengths: list[int], seed: int) -> list[dict]:
    return [
        {"messages": MESSAGES, "max_tokens": n, "temperature": 1.0, "seed": seed + i}
        | {"ignore_eos": True}
        for i, n in enumerate(lengths)
    ]


def _measure(server: Server, args: argparse.Namespace) -> list[dict]:
    """Rounds of schema, unconstrained, schema again (the same seeds, so the same lengths): the
    two schema timings are averaged, so neither kind always runs first on a drifting machine."""
    rounds = []
    asyncio.run(_round(server.url, _constrained(2, 0, "response_format", 64), args.timeout))
    for r in range(args.rounds):
        seed = 1000 * (r + 1)
        bodies = _constrained(args.requests, seed, "response_format", args.max_tokens)
        lengths, first_s = asyncio.run(_round(server.url, bodies, args.timeout))
        plain_lengths, plain_s = asyncio.run(
            _round(server.url, _plain(lengths, seed), args.timeout)
        )
        again, second_s = asyncio.run(_round(server.url, bodies, args.timeout))
        assert plain_lengths == lengths == again, (lengths, plain_lengths, again)
        tokens = sum(lengths)
        shaped_s = (first_s + second_s) / 2
        rounds.append(
            {"tokens": tokens, "schema_tps": tokens / shaped_s, "plain_tps": tokens / plain_s}
        )
        print(f"round {r + 1}: {_line(rounds[-1])}", flush=True)
    return rounds


def _line(r: dict) -> str:
    ratio = r["schema_tps"] / r["plain_tps"]
    return (
        f"{r['tokens']} tokens; schema {r['schema_tps']:.1f} tok/s, "
        f"unconstrained {r['plain_tps']:.1f} tok/s, ratio {ratio:.1%}"
    )


def _llama_server(args: argparse.Namespace, model: str, log_dir: Path) -> None:
    command = [args.llama_server, "-m", model, "--host", "127.0.0.1"]
    command += ["--port", str(args.peer_port), "-np", str(args.requests), "-c", "8192"]
    peer = Server("llama-server", f"http://127.0.0.1:{args.peer_port}", command)
    with running(peer, log_dir / "llama-server.log", args.startup_timeout):
        bodies = _constrained(args.requests, 1000, "json_schema", args.max_tokens)
        lengths, seconds = asyncio.run(_round(peer.url, bodies, args.timeout))
        print(
            f"llama-server json_schema: {sum(lengths) / seconds:.1f} tok/s ({sum(lengths)} tokens)"
        )


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--model", default=None, help="GGUF file (default: the default model)")
    add("--requests", type=int, default=8, help="concurrent requests per round")
    add("--rounds", type=int, default=3)
    add("--max-tokens", type=int, default=400)
    add("--threads", type=int, default=os.cpu_count())
    add("--port", type=int, default=8611)
    add("--timeout", type=float, default=900.0)
    add("--startup-timeout", type=float, default=600.0)
    add("--llama-server", default=None, help="a llama-server binary, for its json_schema figure")
    add("--peer-port", type=int, default=8612)
    return parser.parse_args()


def main() -> None:
    args = _parse_args()
    model = str(resolve_model(args.model))
    log_dir = Path(tempfile.mkdtemp(prefix="met-structured-"))
    print(f"model {model}; {args.requests} concurrent requests; {args.threads} threads")
    server = met_server(model, args.port, args.threads, args.requests, [])
    with running(server, log_dir / "met.log", args.startup_timeout):
        rounds = _measure(server, args)
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(f"median: {_line(median)}")
    if args.llama_server:
        _llama_server(args, model, log_dir)
    else:
        print("llama-server: not measured (no --llama-server binary given)")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
