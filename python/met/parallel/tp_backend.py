"""Rank 0's backend: the single-process TorchBackend, plus the other ranks kept in step.

Every forward's rows (the scheduler's step plan: sequence, start, prompt length, tokens and
block table of each) go to the workers serialized once, before rank 0 runs its own shard; each
worker packs the same inputs from them and its all-reduces meet rank 0's inside the layers. A
released sequence and teardown are messages of their own. There is no vision embedding to sync:
these models have no vision tower.
"""

from __future__ import annotations

import time

from met import _core
from met.engine.forward_rows import Row
from met.engine.torch_backend import TorchBackend
from met.parallel import protocol
from met.parallel.dist import Group
from met.parallel.protocol import Kind, PlannedRow

_PING_EVERY_S = 1.0


class TensorParallelBackend(TorchBackend):
    def __init__(
        self, model, kv_cache, block_manager: _core.BlockManager, max_slots: int, group: Group
    ) -> None:
        super().__init__(model, kv_cache, block_manager, max_slots)
        self.group = group
        self._last_ping = time.monotonic()
        self._shut_down = False

    def for_scheduler(self) -> _core.Backend:
        """Every forward is sent to the worker ranks from here, so none may skip it."""
        return self

    def _forward(
        self, plan: _core.StepPlan, rows: list[Row], tables: list[list[int]], spread: int
    ) -> None:
        planned = [
            PlannedRow(row.seq.session_hash, row.start, row.seq.prompt_len, row.tokens, table)
            for row, table in zip(rows, tables, strict=True)
        ]
        payload = protocol.pack_plan(planned)
        self.group.send(protocol.header(Kind.PLAN, len(rows), 0, payload.numel()), payload)
        self._last_ping = time.monotonic()
        super()._forward(plan, rows, tables, spread)

    def free_sequence(self, seq: _core.Sequence) -> None:
        super().free_sequence(seq)
        self.group.send(protocol.header(Kind.FREE, seq.session_hash))

    def teardown(self) -> None:
        self.group.send(protocol.header(Kind.SHUTDOWN))
        self._shut_down = True

    def heartbeat(self) -> None:
        """Called while idle: a worker that died is noticed within about a second."""
        now = time.monotonic()
        if not self._shut_down and now - self._last_ping >= _PING_EVERY_S:
            self._last_ping = now
            self.group.ping()

    def close(self, clean: bool) -> None:
        self.group.close(clean=clean and self._shut_down)
