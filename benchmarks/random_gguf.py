"""Write a random-weight GGUF file of one family at a chosen size, for benchmarks/offline.py.

The tests' tiny writer (tests/python/family_fixtures.py: the tensors and metadata llama.cpp's
converter writes, Q8_0 linear weights) at a bench-sized shape; the default is Qwen3-0.6B's layer
shape (hidden 1024, 16 heads of 128 over 8 KV heads, FFN 3072) with 8 of its 28 layers and the
tests' 105-token vocabulary (so the output head costs next to nothing). A MoE family (qwen3moe,
mixtral) gets --experts experts of width --ffn, --experts-used per token.

    PYTHONPATH=python python benchmarks/random_gguf.py --family qwen3 --out /tmp/qwen3.gguf
    PYTHONPATH=python python benchmarks/offline.py --model /tmp/qwen3.gguf

MoE decode against a dense model of the same active parameters (the dense FFN as wide as the
k experts a token uses together):

    PYTHONPATH=python python benchmarks/random_gguf.py --family qwen3moe --layers 4 \
        --experts 16 --experts-used 2 --ffn 768 --out /tmp/qwen3moe.gguf
    PYTHONPATH=python python benchmarks/random_gguf.py --family qwen3 --layers 4 \
        --ffn 1536 --out /tmp/qwen3-dense.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from family_fixtures import FAMILIES, write_family_gguf  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen3")
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--ffn", type=int, default=3072)
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--experts", type=int, default=16, help="MoE families only")
    parser.add_argument("--experts-used", type=int, default=2, help="MoE families only")
    args = parser.parse_args()
    shape = {
        "n_layers": args.layers,
        "hidden": args.hidden,
        "n_heads": args.heads,
        "n_kv_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "ffn": args.ffn,
        "context_length": args.context,
    }
    if FAMILIES[args.family]["config"].get("n_experts"):
        shape |= {"n_experts": args.experts, "n_experts_used": args.experts_used}
    if args.family == "phi3":
        raise SystemExit("phi3: its LongRoPE factors are written for the tiny model's head_dim")
    config, _ = write_family_gguf(Path(args.out), args.family, **shape)
    print(f"{args.out}: {args.family}, {config}")


if __name__ == "__main__":
    main()
