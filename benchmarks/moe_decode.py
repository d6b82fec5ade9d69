"""A MoE's decode beside a dense model with the same active parameters, in met and in llama.cpp.

The MoE (qwen3moe: --experts experts of width --expert-ffn, --experts-used per token) and its
dense twin (qwen3, FFN width experts-used * expert-ffn, so a token multiplies the same number of
weights) are random-weight Q8_0 GGUF files from benchmarks/random_gguf.py's writer with the same
attention. Both stay loaded, and each round times both, one after the other, so a shared
machine's load falls on both alike: met's decode at each batch size (met.LLM, the C++ forward
over the blocks; distinct prompts, sampled tokens; 1 + --tokens tokens minus 1 token, so
prefill cancels) and llama.cpp's batch-1 decode (llama-cpp-python, fed varied tokens). Prints
medians over the rounds and the MoE / dense ratio per engine (issue 18's target: met's MoE
decode within 2x of the dense one). Never asserts.

    PYTHONPATH=python python benchmarks/moe_decode.py [--rounds 5] [--batches 1 8] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import met
from met.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from family_fixtures import write_family_gguf  # noqa: E402

PROMPT = list(range(3, 19))


def write_pair(folder: Path, args: argparse.Namespace) -> dict[str, Path]:
    shape = {
        "n_layers": args.layers,
        "hidden": args.hidden,
        "n_heads": 16,
        "n_kv_heads": 8,
        "head_dim": 128,
        "context_length": 1024,
    }
    files = {"moe": folder / "moe.gguf", "dense": folder / "dense.gguf"}
    write_family_gguf(
        files["moe"],
        "qwen3moe",
        ffn=args.expert_ffn,
        n_experts=args.experts,
        n_experts_used=args.experts_used,
        **shape,
    )
    write_family_gguf(files["dense"], "qwen3", ffn=args.experts_used * args.expert_ffn, **shape)
    return files


def met_decode(llm: met.LLM, batch: int, tokens: int) -> float:
    """Aggregate decode tokens/s at `batch` sequences."""

    # Distinct prompts and sampled (seeded) tokens: each step's tokens, so their experts, vary
    # as real text's do. Greedy decoding of random weights repeats one token, which would keep
    # routing to the same experts and their weights in cache.
    prompts = [[3 + (7 * b + i) % 100 for i in range(16)] for b in range(batch)]

    def timed(max_tokens: int) -> float:
        params = [
            SamplingParams(temperature=1.0, seed=b, max_tokens=max_tokens, ignore_eos=True)
            for b in range(batch)
        ]
        start = time.perf_counter()
        llm.generate(prompt_token_ids=prompts, sampling_params=params)
        return time.perf_counter() - start

    return batch * tokens / (timed(1 + tokens) - timed(1))


def llama_cpp_decode(llm, tokens: int) -> float:
    llm.reset()
    llm.eval(PROMPT)
    start = time.perf_counter()
    for token in range(20, 20 + tokens):
        llm.eval([token % 100 + 3])
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--experts-used", type=int, default=2)
    parser.add_argument("--expert-ffn", type=int, default=768)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--json", metavar="FILE", default=None)
    args = parser.parse_args()
    from llama_cpp import Llama

    with tempfile.TemporaryDirectory(prefix="met-moe-") as tmp:
        files = write_pair(Path(tmp), args)
        mets = {n: met.LLM(model=str(p), device="cpu", max_model_len=256) for n, p in files.items()}
        peers = {n: Llama(model_path=str(p), n_ctx=256, verbose=False) for n, p in files.items()}
        samples: dict[str, list[float]] = {}
        for _ in range(1 + args.rounds):  # the first round warms up and is dropped
            for name in files:
                for batch in args.batches:
                    rate = met_decode(mets[name], batch, args.tokens)
                    samples.setdefault(f"met {name} b{batch}", []).append(rate)
                rate = llama_cpp_decode(peers[name], args.tokens)
                samples.setdefault(f"llama.cpp {name} b1", []).append(rate)
        for llm in mets.values():
            llm.close()
    medians = {k: statistics.median(v[1:]) for k, v in samples.items()}
    spreads = {k: max(v[1:]) - min(v[1:]) for k, v in samples.items()}
    print(f"decode tokens/s, median ±spread of {args.rounds} rounds; MoE / dense")
    rows = [("met", b) for b in args.batches] + [("llama.cpp", 1)]
    ratios = {}
    for engine, batch in rows:
        moe, dense = (f"{engine} {n} b{batch}" for n in ("moe", "dense"))
        ratios[f"{engine} b{batch}"] = medians[moe] / medians[dense]
        print(
            f"{engine:9} b{batch:<3} moe {medians[moe]:8.1f} ±{spreads[moe]:<6.1f} "
            f"dense {medians[dense]:8.1f} ±{spreads[dense]:<6.1f} "
            f"moe/dense {ratios[f'{engine} b{batch}']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"samples": samples, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
