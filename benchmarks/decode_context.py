"""Decode speed at a long context: B sequences of a C-token prompt each, decoded together.

offline.py decodes after 16-token prompts, where attention is a sliver of a step; here every
sequence first prefills C tokens, then met's engine is stepped by hand and the steps in which all
B sequences decode (and nothing else runs) are timed. Prints the median step and the aggregate
tokens/s per batch size; --json FILE writes them. Same model options as offline.py's "met gguf".

    .venv/bin/python benchmarks/decode_context.py [--batches 1,8,32] [--context 1000] [--steps 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import met
from met import _core
from met.sampling import SamplingParams

OPTIONS = {"dtype": "float32", "weight_format": "gguf"}
PREFILL_CHUNK = 2048


def _prompt_ids(vocab: int, length: int, seed: int) -> list[int]:
    # Ordinary-text ids, as offline.py makes them.
    return [100 + (seed * 7919 + i * 104729) % (vocab - 100) for i in range(length)]


def measure(model: str | None, batch: int, context: int, steps: int) -> dict[str, float]:
    # Enough tokens for the first sequence to decode while the last prefills, then `steps` more.
    tokens = steps + batch * context // PREFILL_CHUNK + 32
    llm = met.LLM(
        model=model,
        max_num_seqs=batch,
        max_prefill_tokens=PREFILL_CHUNK,
        max_model_len=context + tokens + 8,
        enable_prefix_cache=False,
        **OPTIONS,
    )
    engine = llm.engine
    vocab = engine.model_config.vocab
    greedy = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    for seq in range(batch):
        engine.add_request(f"s{seq}", _prompt_ids(vocab, context, seq), greedy)
    started: set[str] = set()
    while len(started) < batch:  # prefill (and the early finishers' first decode steps)
        started.update(d.request_id for d in engine.step())
    walls = []
    for _ in range(steps):
        # Counted from the engine's total: a delta can hold a token's text back.
        before, begin = engine.generated_tokens_total, time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - begin)
        if engine.generated_tokens_total - before != batch:
            raise SystemExit(f"a step decoded {engine.generated_tokens_total - before} tokens")
    llm.close()
    step = statistics.median(walls)
    return {"batch": batch, "context": context, "step_ms": 1e3 * step, "tokens_per_s": batch / step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="GGUF file (default: the default model)")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--context", type=int, default=1000, help="prompt tokens per sequence")
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    print(f"met CPU kernel path: {_core.cpu.cpu_path()} (matmul {_core.cpu.matmul_kernel()})")
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        rows.append(measure(args.model, batch, args.context, args.steps))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
