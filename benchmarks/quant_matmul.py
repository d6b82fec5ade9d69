"""QuantLinear (met._core.cpu) against torch fp32/bf16 matmul on the default model's shapes.

Prints, per shape and batch M, the median time of each and the weight bytes streamed per
second (the bound that matters for decode). Never asserts. The kernel path is MET_CPU_ISA's (else
the best this CPU runs); the amx path takes tiles from M = 16, so compare it with avx512 at prefill
sizes:

    PYTHONPATH=python python benchmarks/quant_matmul.py [--repeats 200] [--threads N]
    MET_CPU_ISA=amx PYTHONPATH=python python benchmarks/quant_matmul.py --rows 1,8,16,64,512
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from met import _core
from met.kernels.cpu_quant import QuantLinear

# SmolLM2-135M: fused q/k/v (576 + 2 * 192), wo, fused gate/up, down, tied lm_head.
SHAPES = {
    "wqkv": (960, 576),
    "wo": (576, 576),
    "w_gate_up": (3072, 576),
    "w_down": (576, 1536),
    "lm_head": (49152, 576),
}


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


def _runner(op: QuantLinear | torch.Tensor, x: torch.Tensor):
    if isinstance(op, QuantLinear):
        return lambda: op(x)
    xs = x.to(op.dtype)
    return lambda: torch.nn.functional.linear(xs, op)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", default="1,8", help="comma-separated batch sizes M")
    args = parser.parse_args()
    rows = [int(m) for m in args.rows.split(",")]
    torch.set_num_threads(args.threads)
    path = f"{_core.cpu.cpu_path()} path, matmul {_core.cpu.matmul_kernel()}"
    print(f"threads {args.threads}, {path}; median us (p10-p90 spread)")
    header = ("shape", "M", "kind", "us", "spread", "weight GB/s")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    gen = torch.Generator().manual_seed(0)
    for name, (n, k) in SHAPES.items():
        weight = torch.randn(n, k, generator=gen) * 0.05
        repeats = max(5, args.repeats // 10) if name == "lm_head" else args.repeats
        candidates = {"torch fp32": (weight, weight.numel() * 4)}
        bf16 = weight.bfloat16()
        candidates["torch bf16"] = (bf16, bf16.numel() * 2)
        for qtype in ("Q8_0", "Q4_0", "Q4_1"):
            layer = QuantLinear.from_float(weight, qtype)
            candidates[f"met {qtype}"] = (layer, layer.nbytes)
        for m in rows:
            x = torch.randn(m, k, generator=gen)
            for kind, (op, nbytes) in candidates.items():
                fn = _runner(op, x)
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
