"""Ranks 1..N-1 of a tensor-parallel engine: mirror rank 0's sequences, run its forwards.

A worker holds its own slice of every layer and a KV cache with only its KV heads, in the same
block geometry as rank 0's. It owns no scheduler and no block manager: every forward arrives
with the block tables and slots rank 0's block manager chose, so both caches fill identically.
The EP words keep a mirror of which slot holds which prompt, and each announced prompt chunk is
checked against the forward that follows it, which the scheduler runs as that chunk alone: a
word out of order, or a forward that is not the announced chunk, means the two sides disagree
about the protocol or the sequence, which is fatal rather than silently wrong.

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
from torch import Tensor

from met.config import EngineConfig
from met.engine.kv_budget import kv_dtype
from met.model.kv_cache import PagedKvCache
from met.model.llama import LlamaModel
from met.models import load_model
from met.parallel import dist as tp
from met.parallel import protocol
from met.parallel.launch import launched_rank
from met.parallel.protocol import Kind
from met.parallel.shard import shard_weights

log = logging.getLogger("met.parallel.worker")


class ProtocolError(Exception):
    """Rank 0 sent a message this worker did not expect at this point."""


@dataclass
class _Announce:
    slot: int
    words: list[int] = field(default_factory=list)  # chunk length, chunk start, prompt length


@dataclass
class Mirror:
    """Which prompt each of rank 0's slots holds, from the EP words alone."""

    prompts: dict[int, list[int]] = field(default_factory=dict)
    pending: _Announce | None = None
    # The announced chunk (slot, start, tokens) the next forward must run.
    chunk: tuple[int, int, list[int]] | None = None
    stopped: bool = False

    def on_seq_word(self, slot: int, cmd: int) -> None:
        if cmd == protocol.EP_PREFILL:
            self.pending = _Announce(slot)
        elif cmd == protocol.EP_FREE:
            self.prompts.pop(slot, None)
        elif cmd == protocol.EP_SHUTDOWN:
            self.stopped = True
        # Other words announce speculative steps, which this engine does not run.

    def on_word(self, word: int) -> None:
        if self.pending is not None:
            self.pending.words.append(word)

    def on_tokens(self, tokens: list[int]) -> None:
        announce, self.pending = self.pending, None
        if announce is None or len(announce.words) != 3:
            raise ProtocolError("prompt tokens arrived without a complete prefill announcement")
        length, start, prompt_len = announce.words
        if prompt_len != len(tokens) or start + length > prompt_len:
            raise ProtocolError(
                f"slot {announce.slot}: announced chunk ({length}, {start}, {prompt_len}) does "
                f"not fit the {len(tokens)} prompt tokens sent"
            )
        self.prompts[announce.slot] = tokens
        self.chunk = (announce.slot, start, tokens[start : start + length])

    def on_forward(self, input_ids: Tensor, positions: Tensor) -> None:
        """A forward's tokens; right after an announcement, they must be the announced chunk at
        its positions (the scheduler runs an announced chunk as a forward of its own)."""
        chunk, self.chunk = self.chunk, None
        if chunk is None:
            return
        slot, start, tokens = chunk
        at = list(range(start, start + len(tokens)))
        if input_ids.tolist() != tokens or positions.tolist() != at:
            raise ProtocolError(
                f"slot {slot}: the forward after the announcement of prompt tokens "
                f"{start}..{start + len(tokens) - 1} runs {input_ids.numel()} other tokens"
            )


def serve_forever(group: tp.Group, model: LlamaModel, cache: PagedKvCache) -> None:
    """Answers rank 0's messages until the shutdown word."""
    mirror = Mirror()
    while not mirror.stopped:
        (kind, a, b, _, _), payload = group.receive()
        if kind == Kind.FORWARD:
            inputs = protocol.unpack_forward(a, b, payload, model.device)
            mirror.on_forward(inputs["input_ids"], inputs["positions"])
            model.forward(cache, **inputs)
        elif kind == Kind.SEQ_WORD:
            mirror.on_seq_word(a, b)
        elif kind == Kind.WORD:
            mirror.on_word(a)
        elif kind == Kind.TOKENS:
            mirror.on_tokens(payload.tolist())
        elif kind == Kind.PING:
            group.all_reduce(torch.zeros(1, device=group.device))
        else:
            raise ProtocolError(f"unknown message kind {kind}")


def run_worker(rank: int, world: int) -> int:
    """Join the group, load this rank's shard, serve; the process exit status."""
    # Ctrl-C, or torchrun's SIGTERM, reaches every rank at once; a worker must outlive rank 0's
    # drain, which ends with the shutdown word (or rank 0's exit, which the worker notices).
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
