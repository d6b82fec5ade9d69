"""met beside llama.cpp (llama-cpp-python) on the same random-weight GGUF file of every family.

For each family, the tiny model the tests write (tests/python/family_fixtures.py and test_gguf's
Llama, Q8_0 weights) runs greedy continuations of random prompts in both engines. A continuation
agrees when both pick the same token at every step up to its end or up to the first near-tie:
a step whose top-2 logit margin (in either engine) is below --margin, where quantization noise
may fairly pick either token. Prints a table per family; never asserts.

    PYTHONPATH=python python benchmarks/fidelity.py [--prompts 16] [--tokens 16] [--json FILE]
        [--families llama qwen3 ...]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

import met
from met.sampling import SamplingParams

# The writers live with the tests that check each family against its dense reference.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from family_fixtures import FAMILIES, write_family_gguf  # noqa: E402
from gemma_fixtures import CONFIGS as GEMMA  # noqa: E402
from gemma_fixtures import write_gemma_gguf  # noqa: E402
from test_gguf import write_tiny_gguf  # noqa: E402

CONTEXT = 256


def write_files(folder: Path, families: list[str]) -> dict[str, Path]:
    files = {}
    for family in families:
        files[family] = folder / f"{family}.gguf"
        if family == "llama":
            write_tiny_gguf(files[family], tied=False)
        elif family in GEMMA:  # sliding windows shorter than the continuations
            write_gemma_gguf(files[family], family, varied=True)
        else:
            write_family_gguf(files[family], family)
    return files


def _margin(logits: np.ndarray) -> float:
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def llama_cpp_run(path: Path, prompt: list[int], n: int) -> list[tuple[int, float]]:
    """(greedy token, top-2 margin) per step from llama.cpp."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=CONTEXT, logits_all=True, verbose=False)
    llm.eval(prompt)
    out = []
    for _ in range(n):
        logits = np.asarray(llm.scores[llm.n_tokens - 1])
        token = int(np.argmax(logits))
        out.append((token, _margin(logits)))
        llm.eval([token])
    return out


def met_run(llm: met.LLM, prompt: list[int], n: int) -> list[tuple[int, float]]:
    """(greedy token, top-2 margin) per step from met (logprob margins are logit margins)."""
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=2)
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
    steps = []
    for lp in out.outputs[0].logprobs:
        values = sorted((v for _, v in lp.top), reverse=True)
        steps.append((lp.token_id, values[0] - values[1]))
    return steps


def agrees(ours: list[tuple[int, float]], theirs: list[tuple[int, float]], margin: float) -> bool:
    for (a, margin_a), (b, margin_b) in zip(ours, theirs, strict=True):
        if min(margin_a, margin_b) < margin:
            return True  # a near-tie: either token is a fair pick, and the rest follows from it
        if a != b:
            return False
    return True


def family_row(path: Path, prompts: list[list[int]], n: int, margin: float) -> dict:
    llm = met.LLM(model=str(path), device="cpu", max_model_len=CONTEXT)
    try:
        runs = [(met_run(llm, p, n), llama_cpp_run(path, p, n)) for p in prompts]
    finally:
        llm.close()
    agreed = sum(agrees(ours, theirs, margin) for ours, theirs in runs)
    exact = sum([t for t, _ in ours] == [t for t, _ in theirs] for ours, theirs in runs)
    return {"agree": agreed, "exact": exact, "prompts": len(prompts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--margin", type=float, default=0.05)
    parser.add_argument("--json", metavar="FILE", default=None)
    every = ["llama", *sorted(FAMILIES), *sorted(GEMMA)]
    parser.add_argument("--families", nargs="+", choices=every, default=every)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="met-fidelity-") as tmp:
        files = write_files(Path(tmp), args.families)
        table = {}
        for family, path in files.items():
            # Ordinary tokens of the tiny vocabulary (past its three control tokens); the prompts
            # of a family are the same whichever other families run.
            rng = random.Random(family)
            prompts = [
                [rng.randrange(3, 100) for _ in range(rng.randrange(4, 24))]
                for _ in range(args.prompts)
            ]
            table[family] = family_row(path, prompts, args.tokens, args.margin)
    print(f"{'family':8} {'agree (to first near-tie)':>26} {'identical':>10}")
    for family, row in table.items():
        share = f"{row['agree']}/{row['prompts']}"
        print(f"{family:8} {share:>26} {row['exact']:>7}/{row['prompts']}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
