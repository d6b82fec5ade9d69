"""met's offline API (met.LLM) beside llama.cpp (llama-cpp-python) on the same GGUF file.

Prefill of a 512-token prompt (tokens/s) and decode at batch 1, 8 and 32 (aggregate tokens/s),
medians of --runs runs with their spread (max - min). met runs the file three ways: dequantized
fp32, dequantized bf16, and gguf (Q8_0/Q4_0/Q4_1 weights kept quantized); the ratios compare met
gguf with llama.cpp on the same file, the same weight format. Long prompts (prefill of 2048 and
8192 tokens, what an agent client's first request costs) run for met gguf and llama.cpp only,
--long-runs times each. Never asserts.

    PYTHONPATH=python python benchmarks/offline.py [--model FILE] [--json FILE] [--long 2048,8192]

llama.cpp runs in a child process (this script with --peer): a crash there (its AMX path has
segfaulted on some Xeons) is reported as a crash in the table instead of killing the run. It runs
once with flash attention off (llama-cpp-python's default) and once with it on (llama-bench's
default is `auto`; which is faster on a 2-core Zen 4 changed from run to run), and each figure
is the better of the two, the setting printed beside the table
(--peer-flash-attn on|off runs one of them only).

llama.cpp: llama-cpp-python's high-level API gives prefill and batch-1 decode; decode at batch 8
and 32 goes through its low-level API (llama_batch_init / llama_decode on a context with
n_seq_max = B, one token per sequence per step, each sequence its own seq_id), timed the same
way as batch 1: the decode steps alone, after the B prompts are prefilled in one batch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import met
from met import _core
from met.models import resolve_model
from met.sampling import SamplingParams

PREFILL = 512
LONG_PREFILLS = (2048, 8192)
LONG_CHUNK = 2048  # met's max_prefill_tokens and llama.cpp's n_batch for the long prompts
DECODE_TOKENS = 32
BATCHES = (1, 8, 32)
MET_VARIANTS = {
    "met fp32": {"dtype": "float32", "weight_format": "dequantized"},
    "met bf16": {"dtype": "bfloat16", "weight_format": "dequantized"},
    "met gguf": {"dtype": "float32", "weight_format": "gguf"},
}
RATIO_ROW = "met gguf"
Figure = dict[str, float]  # median, spread


def _summary(samples: list[float]) -> Figure:
    return {"median": statistics.median(samples), "spread": max(samples) - min(samples)}


def _repeat(measure: Callable[[], float], runs: int, warm_up: bool = True) -> Figure:
    if warm_up:
        measure()  # first-call allocations and thread pools
    return _summary([measure() for _ in range(runs)])


def _prompt_ids(vocab: int, length: int, seed: int) -> list[int]:
    # Ordinary-text ids: past the control tokens at the start of the vocabulary.
    return [100 + (seed * 7919 + i * 104729) % (vocab - 100) for i in range(length)]


def _met_figures(
    model: str, options: dict, runs: int, long: tuple[int, ...] = (), long_runs: int = 1
) -> dict[str, Figure]:
    longest = max((PREFILL, *long))
    llm = met.LLM(
        model=model,
        max_num_seqs=max(BATCHES),
        max_prefill_tokens=LONG_CHUNK if long else PREFILL,
        max_model_len=longest + DECODE_TOKENS + 64,
        enable_prefix_cache=False,  # repeated prompts must be computed again, not looked up
        **options,
    )
    vocab = llm.engine.model_config.vocab

    def timed(prompts: list[list[int]], max_tokens: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(prompt_token_ids=prompts, sampling_params=params)
        return time.perf_counter() - start

    long_prompt = [_prompt_ids(vocab, PREFILL, 0)]
    figures = {"prefill_512": _repeat(lambda: PREFILL / timed(long_prompt, 1), runs)}
    for batch in BATCHES:
        prompts = [_prompt_ids(vocab, 16, seed) for seed in range(batch)]

        def decode_rate(prompts: list[list[int]] = prompts) -> float:
            # The same prompts with one token and with 1 + DECODE_TOKENS: the difference is
            # decode alone, prefill and the first token cancel.
            elapsed = timed(prompts, 1 + DECODE_TOKENS) - timed(prompts, 1)
            return len(prompts) * DECODE_TOKENS / elapsed

        figures[f"decode_b{batch}"] = _repeat(decode_rate, runs)
    for length in long:
        # One position short: the generated token needs one, and 8192 is the default model's
        # whole context.
        prompt = [_prompt_ids(vocab, length - 1, 1)]
        figures[f"prefill_{length}"] = _repeat(
            lambda p=prompt, n=length - 1: n / timed(p, 1), long_runs, warm_up=False
        )
    llm.close()
    return figures


def _llama_cpp_figures(
    model: str, runs: int, long: tuple[int, ...] = (), long_runs: int = 1, flash_attn: bool = False
) -> dict[str, Figure | None]:
    from llama_cpp import Llama

    llm = Llama(
        model_path=model,
        n_ctx=max((PREFILL, *long)) + DECODE_TOKENS + 64,
        n_batch=LONG_CHUNK if long else PREFILL,
        n_ubatch=PREFILL,
        n_threads=os.cpu_count(),
        n_threads_batch=os.cpu_count(),
        flash_attn=flash_attn,
        verbose=False,
    )
    prompt = _prompt_ids(llm.n_vocab(), PREFILL, 0)

    def prefill(ids: list[int] = prompt) -> float:
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        return len(ids) / (time.perf_counter() - start)

    def decode() -> float:
        llm.reset()
        llm.eval(prompt[:16])
        start = time.perf_counter()
        for token in prompt[16 : 16 + DECODE_TOKENS]:
            llm.eval([token])
        return DECODE_TOKENS / (time.perf_counter() - start)

    figures: dict[str, Figure | None] = {"prefill_512": _repeat(prefill, runs)}
    figures["decode_b1"] = _repeat(decode, runs)
    for batch in BATCHES:
        if batch != 1:
            figures[f"decode_b{batch}"] = _llama_cpp_parallel_decode(llm, batch, runs, flash_attn)
    for length in long:
        ids = _prompt_ids(llm.n_vocab(), length, 1)
        figures[f"prefill_{length}"] = _repeat(lambda i=ids: prefill(i), long_runs, warm_up=False)
    return figures


def _llama_cpp_in_child(
    model: str, runs: int, long: tuple[int, ...], long_runs: int, flash_attn: str
) -> dict:
    """The peer's figures from `offline.py --peer` in a child process: {"figures": ...} or
    {"error": why} when it is not installed, fails or crashes (a signal, e.g. SIGSEGV)."""
    command = [sys.executable, __file__, "--peer", "--model", model, "--runs", str(runs)]
    command += ["--long", ",".join(map(str, long)), "--long-runs", str(long_runs)]
    command += ["--peer-flash-attn", flash_attn]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode < 0:
        return {"error": f"crashed ({signal.Signals(-done.returncode).name})"}
    last = done.stdout.strip().splitlines()[-1:] or [""]
    try:
        return json.loads(last[0])
    except json.JSONDecodeError:
        tail = " ".join(done.stderr.strip().splitlines()[-2:])
        return {"error": f"exited with {done.returncode}: {tail}"}


def _peer_main(model: str, runs: int, long: tuple[int, ...], long_runs: int, fa: str) -> None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print(json.dumps({"error": "not installed (pip install 'met[bench]')"}))
        return
    figures = _llama_cpp_figures(model, runs, long, long_runs, flash_attn=fa == "on")
    print(json.dumps({"figures": figures}), flush=True)


def _best_peer(
    model: str, runs: int, long: tuple[int, ...], long_runs: int, settings: list[str]
) -> dict:
    """The peer once per flash-attention setting; per figure the better run, and which it was
    ({"figures": ..., "flash_attn": {key: "on"|"off"}}), with "error" naming each setting whose
    child failed or crashed."""
    best: dict[str, Figure | None] = {}
    chosen: dict[str, str] = {}
    errors = []
    for fa in settings:
        run = _llama_cpp_in_child(model, runs, long, long_runs, fa)
        if "error" in run:
            errors.append(f"flash attention {fa}: {run['error']}")
            continue
        for key, figure in run["figures"].items():
            if figure and (not best.get(key) or figure["median"] > best[key]["median"]):
                best[key], chosen[key] = figure, fa
            best.setdefault(key, None)
    result: dict[str, Any] = {"figures": best or None, "flash_attn": chosen}
    if errors:
        result["error"] = "; ".join(errors)
    return result


def _fill_batch(batch: Any, entries: list[tuple[int, int, int, bool]]) -> None:
    """Write (token, position, sequence id, wants logits) rows into a llama_batch."""
    batch.n_tokens = len(entries)
    for i, (token, pos, seq, logits) in enumerate(entries):
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits


def _llama_cpp_parallel_decode(llm: Any, n_seqs: int, runs: int, flash_attn: bool) -> Figure:
    """Aggregate decode tokens/s of n_seqs sequences stepped together in one llama_decode."""
    import llama_cpp as lc

    prompt_len = 16
    params = lc.llama_context_default_params()
    params.n_seq_max = n_seqs
    params.n_ctx = n_seqs * (prompt_len + DECODE_TOKENS + 16)  # split evenly over the sequences
    params.n_batch = params.n_ubatch = n_seqs * prompt_len  # every prompt prefilled at once
    params.n_threads = params.n_threads_batch = os.cpu_count() or 1
    on, off = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED, lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.flash_attn_type = on if flash_attn else off
    ctx = lc.llama_init_from_model(llm.model, params)
    if not ctx:
        raise RuntimeError(f"llama.cpp: no context for {n_seqs} sequences")
    batch = lc.llama_batch_init(n_seqs * prompt_len, 0, 1)
    prompts = [_prompt_ids(llm.n_vocab(), prompt_len + DECODE_TOKENS, s) for s in range(n_seqs)]

    def decode(entries: list[tuple[int, int, int, bool]]) -> None:
        _fill_batch(batch, entries)
        if (status := lc.llama_decode(ctx, batch)) != 0:
            raise RuntimeError(f"llama_decode returned {status}")

    def rate() -> float:
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        decode(
            [
                (prompt[pos], pos, seq, pos == prompt_len - 1)
                for seq, prompt in enumerate(prompts)
                for pos in range(prompt_len)
            ]
        )
        start = time.perf_counter()
        for pos in range(prompt_len, prompt_len + DECODE_TOKENS):
            # The next token is fixed rather than sampled, as in the batch-1 figure.
            decode([(prompt[pos], pos, seq, True) for seq, prompt in enumerate(prompts)])
        lc.llama_synchronize(ctx)
        return n_seqs * DECODE_TOKENS / (time.perf_counter() - start)

    try:
        return _repeat(rate, runs)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)


def _keys(long: tuple[int, ...]) -> list[str]:
    return ["prefill_512"] + [f"decode_b{b}" for b in BATCHES] + [f"prefill_{n}" for n in long]


def _ratios(
    ours: dict[str, Figure], peer: dict[str, Figure | None] | None, keys: list[str]
) -> dict:
    if peer is None:
        return dict.fromkeys(keys)
    return {
        k: None if not peer.get(k) or k not in ours else ours[k]["median"] / peer[k]["median"]
        for k in keys
    }


def _print_table(results: dict[str, dict | None], ratios: dict, keys: list[str]) -> None:
    print("| engine | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for engine, figures in results.items():
        if figures is None:
            continue
        cells = [
            "-"
            if figures.get(k) is None
            else f"{figures[k]['median']:.0f} ±{figures[k]['spread']:.0f}"
            for k in keys
        ]
        print(f"| {engine} | " + " | ".join(cells) + " |")
    shown = ["-" if ratios[k] is None else f"{ratios[k]:.2f}x" for k in keys]
    print(f"| {RATIO_ROW} / llama.cpp | " + " | ".join(shown) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--long", default=",".join(map(str, LONG_PREFILLS)), help="long prompt lengths, or ''"
    )
    parser.add_argument("--long-runs", type=int, default=1, help="runs of each long prefill")
    parser.add_argument("--json", metavar="FILE", default=None)
    parser.add_argument(
        "--variants", nargs="+", choices=list(MET_VARIANTS), default=list(MET_VARIANTS)
    )
    parser.add_argument(
        "--peer-flash-attn",
        choices=("both", "on", "off"),
        default="both",
        help="llama.cpp's flash attention: both (the better per figure), on or off",
    )
    parser.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    model = str(resolve_model(args.model))
    long = tuple(int(n) for n in args.long.split(",") if n)
    if args.peer:
        return _peer_main(model, args.runs, long, args.long_runs, args.peer_flash_attn)
    print(f"model {model}; tokens/s, median ±spread (max - min) of {args.runs} runs")
    print(f"met CPU kernel path: {_core.cpu.cpu_path()} (matmul {_core.cpu.matmul_kernel()})")
    results: dict[str, dict | None] = {}
    for name in args.variants:
        options = MET_VARIANTS[name]
        extra = (long, args.long_runs) if name == RATIO_ROW else ()
        results[name] = _met_figures(model, options, args.runs, *extra)
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    settings = ["off", "on"] if args.peer_flash_attn == "both" else [args.peer_flash_attn]
    peer = _best_peer(model, args.runs, long, args.long_runs, settings)
    results["llama.cpp"] = peer.get("figures")
    if "error" in peer:
        print(f"llama.cpp: {peer['error']}")
    if peer["flash_attn"]:
        print("llama.cpp flash attention per figure: " + json.dumps(peer["flash_attn"]))
    keys = _keys(long)
    ratios = _ratios(results.get(RATIO_ROW) or {}, results["llama.cpp"], keys)
    _print_table(results, ratios, keys)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "model": model,
                    "runs": args.runs,
                    "cpu_path": _core.cpu.cpu_path(),
                    "matmul_kernel": _core.cpu.matmul_kernel(),
                    "engines": results,
                    "peer_error": peer.get("error"),
                    "peer_flash_attn": peer["flash_attn"],
                    "ratios": ratios,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
