"""QuantLinear (met._core.cpu) against torch fp32/bf16 matmul on the default model's shapes.

Prints, per shape and batch M, the median time of each and the weight bytes streamed per
second (the bound that matters for decode). Never asserts. The kernel path is MET_CPU_ISA's (else
the best this CPU runs); the amx path takes tiles from M = 16, so compare it with avx512 at prefill
sizes. The weight GB/s column compares formats per weight byte (MXFP4's 17-byte blocks against
Q4_0's 18, say); the super-block formats (the K-quants, IQ4_XS) run only on shapes whose K is a
multiple of their 256 elements, and the formats gguf cannot quantize to on random valid blocks:

    PYTHONPATH=python python benchmarks/quant_matmul.py [--repeats 200] [--threads N]
    MET_CPU_ISA=amx PYTHONPATH=python python benchmarks/quant_matmul.py --rows 1,8,16,64,512
    PYTHONPATH=python python benchmarks/quant_matmul.py --qtypes Q4_0,MXFP4 --no-torch

The default model's shapes stay in cache; a decode step reads its weights from memory. For that,
--copies N cycles each call through N copies of the weights, and --shapes square4096 (not in the
default list) is a 4096-wide model's projection:

    PYTHONPATH=python python benchmarks/quant_matmul.py --shapes square4096 --copies 4 \
      --rows 1,2,4 --qtypes Q2_K,Q3_K,Q4_K --no-torch --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import gguf
import numpy as np
import torch

from met import _core
from met.kernels.cpu_quant import QTYPES, QuantLinear

# SmolLM2-135M: fused q/k/v (576 + 2 * 192), wo, fused gate/up, down, tied lm_head.
SHAPES = {
    "wqkv": (960, 576),
    "wo": (576, 576),
    "w_gate_up": (3072, 576),
    "w_down": (576, 1536),
    "lm_head": (49152, 576),
}
# Run only when named: weights that, in a few copies, no cache holds.
LARGE_SHAPES = {"square4096": (4096, 4096)}


def _median_seconds(fn, repeats: int) -> tuple[float, float]:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return statistics.median(times), times[len(times) * 9 // 10] - times[len(times) // 10]


# The formats gguf cannot quantize to, run on random valid blocks: where each keeps its fp16 d
# (and dmin) in a block.
_RANDOM_BLOCKS = {
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}


def _random_layer(qtype: str, n: int, k: int, seed: int) -> QuantLinear:
    """Random valid blocks: random sub-block scales and quants, small fp16 d (and dmin)."""
    elements, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, k // elements, size), dtype=np.uint8)
    for offset in _RANDOM_BLOCKS[qtype]:
        scale = rng.uniform(1e-4, 1e-3, raw.shape[:2]).astype(np.float16)
        raw[..., offset : offset + 2] = scale[..., None].view(np.uint8)
    return QuantLinear(torch.from_numpy(raw.reshape(n, -1)), qtype, n, k)


def _runner(ops: list[QuantLinear] | list[torch.Tensor], x: torch.Tensor):
    """One call of the next of `ops` (the copies of one weight) on x."""
    turn = iter(range(1 << 62))
    if isinstance(ops[0], QuantLinear):
        return lambda: ops[next(turn) % len(ops)](x)
    xs = x.to(ops[0].dtype)
    return lambda: torch.nn.functional.linear(xs, ops[next(turn) % len(ops)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", default="1,8", help="comma-separated batch sizes M")
    parser.add_argument("--qtypes", default=",".join(QTYPES), help="comma-separated formats")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated shape names")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch fp32/bf16 rows")
    parser.add_argument(
        "--copies", type=int, default=1, help="weight copies each call cycles through"
    )
    args = parser.parse_args()
    rows = [int(m) for m in args.rows.split(",")]
    torch.set_num_threads(args.threads)
    path = f"{_core.cpu.cpu_path()} path, matmul {_core.cpu.matmul_kernel()}"
    print(f"threads {args.threads}, {path}; median us (p10-p90 spread)")
    header = ("shape", "M", "kind", "us", "spread", "weight GB/s")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    gen = torch.Generator().manual_seed(0)
    for name in args.shapes.split(","):
        n, k = {**SHAPES, **LARGE_SHAPES}[name]
        weight = torch.randn(n, k, generator=gen) * 0.05
        repeats = max(5, args.repeats // 10) if name == "lm_head" else args.repeats
        candidates = {}
        if not args.no_torch:
            bf16 = weight.bfloat16()
            candidates["torch fp32"] = (
                [weight.clone() for _ in range(args.copies)],
                weight.numel() * 4,
            )
            candidates["torch bf16"] = (
                [bf16.clone() for _ in range(args.copies)],
                bf16.numel() * 2,
            )
        for qtype in args.qtypes.split(","):
            if k % _core.cpu.block_elements(qtype):
                continue
            if qtype in _RANDOM_BLOCKS:
                layers = [_random_layer(qtype, n, k, n + c) for c in range(args.copies)]
            else:
                layers = [QuantLinear.from_float(weight, qtype) for _ in range(args.copies)]
            candidates[f"met {qtype}"] = (layers, layers[0].nbytes)
        for m in rows:
            x = torch.randn(m, k, generator=gen)
            for kind, (ops, nbytes) in candidates.items():
                fn = _runner(ops, x)
                with torch.inference_mode():
                    median, spread = _median_seconds(fn, repeats)
                row = (
                    f"{name} {n}x{k}",
                    str(m),
                    kind,
                    f"{median * 1e6:.0f}",
                    f"{spread * 1e6:.0f}",
                    f"{nbytes / median / 1e9:.1f}",
                )
                print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
