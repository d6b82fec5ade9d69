"""CPU/GPU speed of the paged forward on a model file: prefill 512 and decode batch 1 / 8.

Usage: PYTHONPATH=python python benchmarks/model_forward.py [--model PATH] [--dtype float32 ...]
Prints medians; never asserts. Compare with the reference points in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from met.gguf_loader import load_gguf
from met.hf_loader import is_hf_folder, load_hf
from met.model.kv_cache import PagedKvCache
from met.model.llama import LlamaModel
from met.models import resolve_device, resolve_model

BLOCK = 16


def _row_inputs(
    tables: torch.Tensor, rows: list[int], starts: list[int], lens: list[int]
) -> dict[str, torch.Tensor]:
    """Packed inputs for rows `rows` writing lens[i] tokens from position starts[i]."""
    pos = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
    owner = torch.cat([torch.full((n,), r) for r, n in zip(rows, lens, strict=True)])
    cu = torch.tensor([0, *lens]).cumsum(0)
    return {
        "input_ids": torch.randint(100, 20000, (len(pos),)),
        "positions": pos,
        "slot_mapping": tables[owner, pos // BLOCK] * BLOCK + pos % BLOCK,
        "block_tables": tables[rows],
        "seq_lens": torch.tensor([s + n for s, n in zip(starts, lens, strict=True)]),
        "cu_seqlens": cu,
        "logits_rows": cu[1:] - 1,
    }


def _timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(model: LlamaModel, cache: PagedKvCache, tables: torch.Tensor, context: int) -> None:
    prefill = _row_inputs(tables, [0], [0], [512])
    seconds = _timed(lambda: model.forward(cache, **prefill), 3)
    print(f"  prefill 512: {512 / seconds:7.0f} tok/s")
    for batch in (1, 8):
        rows = list(range(batch))
        model.forward(cache, **_row_inputs(tables, rows, [0] * batch, [context] * batch))
        step = _row_inputs(tables, rows, [context] * batch, [1] * batch)
        seconds = _timed(lambda step=step: model.forward(cache, **step), 20)
        print(
            f"  decode batch {batch} (context {context}): {1 / seconds:6.1f} steps/s, "
            f"{batch / seconds:6.0f} tok/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    device = resolve_device(args.device)
    for name in args.dtype:
        dtype = getattr(torch, name)
        config, weights = load_hf(path, dtype) if is_hf_folder(path) else load_gguf(path, dtype)
        model = LlamaModel(config, weights, dtype, device)
        blocks_per_row = (max(512, args.context + 1) + BLOCK - 1) // BLOCK
        cache = model.allocate_kv_cache(8 * blocks_per_row, BLOCK)
        tables = torch.arange(8 * blocks_per_row).view(8, blocks_per_row)
        print(f"{path.name} {name} on {device}, {args.threads} threads")
        bench(model, cache, tables, args.context)


if __name__ == "__main__":
    main()
