"""Host overhead of a decode step: how much of each engine step is spent outside the C++
forward (scheduler tick, the Python backend's packing and bookkeeping, the readback or sampling).

Steps met's engine by hand on the default model (GGUF weights, the C++ CPU forward), `--batch`
requests at once (greedy unless --temperature), and compares each decode step's wall time with
the time the C++ forward reports for it. Each run measures both paths a decode step can take,
interleaved: `direct` (the scheduler runs the C++ forward itself, DirectForward) and `python`
(every step through the Python TorchBackend, as before DirectForward). Prints medians and the
overall share; --json FILE writes them. Never asserts.

    .venv/bin/python benchmarks/host_overhead.py [--model FILE] [--batch 1,32] [--tokens 128]
        [--temperature 0.8]   # sampled requests (seeded): each step samples on the host
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from unittest import mock

import met
from met.engine.torch_backend import TorchBackend
from met.model.cpu_llama import CpuLlama
from met.sampling import SamplingParams

PATHS = ("direct", "python")


def _llm(model: str | None, batch: int, path: str) -> met.LLM:
    if path == "direct":
        return met.LLM(model=model, max_num_seqs=batch)
    with mock.patch.object(TorchBackend, "for_scheduler", lambda self: self):
        return met.LLM(model=model, max_num_seqs=batch)


def measure(
    model: str | None, tokens: int, prompt_len: int, batch: int, path: str, temperature: float
) -> dict:
    llm = _llm(model, batch, path)
    engine = llm.engine
    forward = engine.backend.model
    if not isinstance(forward, CpuLlama):
        raise SystemExit("the model does not run through the C++ CPU forward (not Q8_0/Q4_x?)")
    params = SamplingParams(temperature=temperature, seed=1, max_tokens=tokens, ignore_eos=True)
    vocab = engine.model_config.vocab  # a test fixture's is about a hundred tokens
    for r in range(batch):
        prompt = [(100 + (i * 7919 + r * 131) % 1000) % vocab for i in range(prompt_len)]
        engine.add_request(f"r{r}", prompt, params)
    started_ids: set[str] = set()
    pairs, made = [], 0  # (wall, forward) of the steps that decoded every request, their tokens
    while engine.has_work():
        decoding = len(started_ids) == batch
        before_kernel, started = forward.kernel_seconds, time.perf_counter()
        deltas = engine.step()
        wall, kernel = time.perf_counter() - started, forward.kernel_seconds - before_kernel
        if any(d.finished for d in deltas):
            break  # the batch shrinks from here on
        started_ids.update(d.request_id for d in deltas if d.token_ids)
        if decoding and kernel > 0:
            pairs.append((wall, kernel))
            made += sum(len(d.token_ids) for d in deltas)
    llm.close()
    decode_wall = sum(w for w, _ in pairs)
    decode_kernel = sum(k for _, k in pairs)
    return {
        "path": path,
        "decode_steps": len(pairs),
        "step_ms_median": 1e3 * statistics.median(w for w, _ in pairs),
        "forward_ms_median": 1e3 * statistics.median(k for _, k in pairs),
        "host_ms_median": 1e3 * statistics.median(w - k for w, k in pairs),
        "host_share": (decode_wall - decode_kernel) / decode_wall,
        "tokens_per_s": made / decode_wall,
        "threads": forward.n_threads,
    }


def report(batch: int, runs: list[dict[str, float]]) -> None:
    print(f"batch-{batch} decode, {runs[0]['decode_steps']} steps, {runs[0]['threads']} threads")
    header = ("run", "path", "step ms", "forward ms", "host ms", "host share", "tok/s")
    print("{:>4} {:>7} {:>8} {:>10} {:>8} {:>10} {:>7}".format(*header))
    for i, r in enumerate(runs):
        print(
            f"{i // len(PATHS):>4} {r['path']:>7} {r['step_ms_median']:>8.3f} "
            f"{r['forward_ms_median']:>10.3f} "
            f"{r['host_ms_median']:>8.3f} {100 * r['host_share']:>9.2f}% {r['tokens_per_s']:>7.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="GGUF file (default: the default model)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens to decode")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--batch", default="1", help="comma-separated batch sizes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    out = {}
    for batch in map(int, args.batch.split(",")):
        runs = [
            measure(args.model, args.tokens, args.prompt_len, batch, path, args.temperature)
            for _ in range(args.runs)
            for path in PATHS
        ]
        report(batch, runs)
        out[batch] = runs
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": out}, f, indent=2)


if __name__ == "__main__":
    main()
