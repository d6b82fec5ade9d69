"""Rank 0's backend: the single-process TorchBackend, plus the other ranks kept in step.

The scheduler's EP words (trace spec section 7), which mean nothing to one process, go to the
workers as they are issued; every forward first sends its packed inputs, block tables
included, then runs rank 0's own shard, whose all-reduces meet the workers' inside the layers.
ep_sync_vision_embeds sends nothing: these models have no vision tower to sync.
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


class TensorParallelBackend(TorchBackend):
    def __init__(
        self, model, kv_cache, block_manager: _core.BlockManager, max_slots: int, group: Group
    ) -> None:
        super().__init__(model, kv_cache, block_manager, max_slots)
        self.group = group
        self._last_ping = time.monotonic()
        self._shut_down = False

    def ep_broadcast_cmd_for_seq(self, seq: int, cmd: int) -> None:
        self.group.send(protocol.header(Kind.SEQ_WORD, seq, cmd))
        self._shut_down = cmd == protocol.EP_SHUTDOWN

    def ep_broadcast_cmd(self, word: int) -> None:
        self.group.send(protocol.header(Kind.WORD, word))

    def ep_broadcast_tokens(self, tokens: list[int]) -> None:
        payload = torch.tensor(list(tokens), dtype=torch.int64)
        self.group.send(protocol.header(Kind.TOKENS, payload_len=payload.numel()), payload)

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
