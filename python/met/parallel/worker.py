"""Ranks 1..N-1 of a tensor-parallel engine: mirror rank 0's sequences, run its forwards.

A worker holds its own slice of every layer and a KV cache with only its KV heads, in the same
block geometry as rank 0's. It owns no scheduler and no block manager: every forward arrives as
the rows of rank 0's step plan, block tables included, and the worker packs from them exactly the
inputs rank 0 packs, so both caches fill identically. A mirror of how far each sequence has run
checks every row against the ones before it: a new sequence's first row must start its prompt
at a block boundary (a prefix-cache hit ends on one), a known one's must continue where its last
row ended (these ranks run no speculation, so nothing rolls back). A row that does not
means the two sides disagree about the protocol or the sequence, which is fatal rather than
silently wrong.

Run as `python -m met.parallel.worker` with torchrun's variables (rank 0 spawns it that way),
or reached from `met serve` on a rank > 0 under torchrun.
"""

from __future__ import annotations

import logging
import signal
import sys
from dataclasses import dataclass, field
from functools import partial

import torch

from met.config import EngineConfig
from met.engine.forward_rows import pack_rows
from met.engine.kv_budget import kv_dtype
from met.model.kv_cache import PagedKvCache
from met.model.llama import LlamaModel
from met.models import load_model
from met.parallel import dist as tp
from met.parallel import protocol
from met.parallel.launch import launched_rank
from met.parallel.protocol import Kind, PlannedRow
from met.parallel.shard import shard_weights

log = logging.getLogger("met.parallel.worker")


class ProtocolError(Exception):
    """Rank 0 sent a message this worker did not expect at this point."""


@dataclass
class Mirror:
    """How many positions each of rank 0's sequences has run, from the plans alone."""

    block_size: int
    lengths: dict[int, int] = field(default_factory=dict)
    stopped: bool = False

    def on_plan(self, rows: list[PlannedRow]) -> None:
        for row in rows:
            end = row.start + len(row.tokens)
            known = self.lengths.get(row.seq)
            if known is None and (row.start >= row.prompt_len or row.start % self.block_size):
                raise ProtocolError(
                    f"sequence {row.seq}: its first row starts at {row.start}, not a prompt's "
                    f"block boundary (prompt of {row.prompt_len})"
                )
            if known is not None and row.start != known:
                raise ProtocolError(
                    f"sequence {row.seq}: a row at {row.start}..{end - 1} after {known} positions"
                )
            if len(row.table) * self.block_size < end:
                raise ProtocolError(f"sequence {row.seq}: its block table ends before {end}")
            self.lengths[row.seq] = end

    def on_free(self, seq: int) -> None:
        self.lengths.pop(seq, None)  # freed before its first forward: never seen


def serve_forever(group: tp.Group, model: LlamaModel, cache: PagedKvCache) -> None:
    """Answers rank 0's messages until the shutdown."""
    mirror = Mirror(cache.block_size)
    while not mirror.stopped:
        (kind, a, _, _, _), payload = group.receive()
        if kind == Kind.PLAN:
            rows = protocol.unpack_plan(a, payload)
            mirror.on_plan(rows)
            inputs = pack_rows(rows, [r.table for r in rows], cache.block_size, model.device)
            # Only rank 0 samples: the other ranks skip the LM head.
            inputs["logits_rows"] = torch.empty(0, dtype=torch.int64, device=model.device)
            model.forward(cache, **inputs)
        elif kind == Kind.FREE:
            mirror.on_free(a)
        elif kind == Kind.SHUTDOWN:
            mirror.stopped = True
        elif kind == Kind.PING:
            group.all_reduce(torch.zeros(1, device=group.device))
        else:
            raise ProtocolError(f"unknown message kind {kind}")


def run_worker(rank: int, world: int) -> int:
    """Join the group, load this rank's shard, serve; the process exit status."""
    # Ctrl-C, or torchrun's SIGTERM, reaches every rank at once; a worker must outlive rank 0's
    # drain, which ends with the shutdown message (or rank 0's exit, which the worker notices).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    group, model, cache = _start(rank, world)
    try:
        serve_forever(group, model, cache)
    except RuntimeError as exc:  # collectives fail this way when rank 0 dies or hangs up
        log.error("rank %d: lost rank 0, exiting: %s", rank, exc)
        return 1
    group.close(clean=True)
    log.info("rank %d: shut down by rank 0", rank)
    return 0


def _start(rank: int, world: int) -> tuple[tp.Group, LlamaModel, PagedKvCache]:
    group, setup = tp.join_worker(rank, world)
    config = EngineConfig(**setup["config"])
    _, model, _ = load_model(
        setup["model_path"],
        dtype=config.dtype,
        device=group.device,
        shard=partial(
            shard_weights, rank=rank, world=world, expert_parallel=config.enable_expert_parallel
        ),
        weight_format=config.weight_format,
    )
    # Rank 0 runs the torch forward under tensor parallelism, and sized its pool the same way.
    pool_dtype = kv_dtype(config.kv_cache_dtype, model.dtype, cpp_cpu_forward=False)
    cache = model.allocate_kv_cache(setup["num_blocks"], config.block_size, pool_dtype)
    model.reduce = group.all_reduce
    tp.finish_worker_setup(group)
    log.info("rank %d of %d: serving %s", rank, world, setup["model_path"])
    return group, model, cache


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    )
    launched = launched_rank()
    if launched is None or launched[0] == 0:
        print("met.parallel.worker: run with RANK >= 1 and WORLD_SIZE set", file=sys.stderr)
        return 2
    return run_worker(*launched)


if __name__ == "__main__":
    sys.exit(main())
