"""Rank 0's backend: the single-process TorchBackend, plus the other ranks kept in step.

The workers still speak the reference's EP words (trace spec section 7), which this backend
derives from the scheduler's own calls: a standalone prefill plan (the reference's prefill and
prefill_chunk) is announced first, a released slot is told, and teardown is the shutdown word.
Every forward then sends its packed inputs, block tables included, and runs rank 0's own
shard, whose all-reduces meet the workers' inside the layers. There is no vision embedding to
sync: these models have no vision tower.
"""

from __future__ import annotations

import time

import torch

from met import _core
from met.engine.torch_backend import TorchBackend
from met.parallel import protocol
from met.parallel.dist import Group
from met.parallel.protocol import Kind

_PING_EVERY_S = 1.0
# The plans that run one prompt chunk on its own, which the workers check against its
# announcement.
_ANNOUNCED = (_core.ReferenceCall.Prefill, _core.ReferenceCall.PrefillChunk)


class TensorParallelBackend(TorchBackend):
    def __init__(
        self, model, kv_cache, block_manager: _core.BlockManager, max_slots: int, group: Group
    ) -> None:
        super().__init__(model, kv_cache, block_manager, max_slots)
        self.group = group
        self._last_ping = time.monotonic()
        self._shut_down = False

    def for_scheduler(self) -> _core.Backend:
        """Every forward is announced to the worker ranks from here, so none may skip it."""
        return self

    def execute(self, plan: _core.StepPlan) -> list[int]:
        if plan.call in _ANNOUNCED:
            self._announce(plan.rows[0])
        return super().execute(plan)

    def _announce(self, row: _core.PlanRow) -> None:
        """The chunk's (length, start, prompt length) and the whole prompt, before its forward."""
        prompt = row.prompt
        self._seq_word(row.seq.slot, protocol.EP_PREFILL)
        for word in (len(row.tokens), row.start, len(prompt)):
            self.group.send(protocol.header(Kind.WORD, word))
        payload = torch.tensor(prompt, dtype=torch.int64)
        self.group.send(protocol.header(Kind.TOKENS, payload_len=payload.numel()), payload)

    def free_sequence(self, seq: _core.Sequence) -> None:
        slot = seq.slot
        super().free_sequence(seq)
        self._seq_word(slot, protocol.EP_FREE)

    def teardown(self) -> None:
        self._seq_word(0, protocol.EP_SHUTDOWN)

    def _seq_word(self, slot: int, cmd: int) -> None:
        self.group.send(protocol.header(Kind.SEQ_WORD, slot, cmd))
        self._shut_down = cmd == protocol.EP_SHUTDOWN

    def _run_model(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        n_tok, n_rows, payload = protocol.pack_forward(inputs)
        head = protocol.header(Kind.FORWARD, n_tok, n_rows, payload.numel())
        self.group.send(head, payload)
        self._last_ping = time.monotonic()
        return super()._run_model(inputs)

    def heartbeat(self) -> None:
        """Called while idle: a worker that died is noticed within about a second."""
        now = time.monotonic()
        if not self._shut_down and now - self._last_ping >= _PING_EVERY_S:
            self._last_ping = now
            self.group.ping()

    def close(self, clean: bool) -> None:
        self.group.close(clean=clean and self._shut_down)
