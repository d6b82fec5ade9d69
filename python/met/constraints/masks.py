"""Token bitmasks of the constrained rows, computed on a worker thread while the forward runs.

The backend starts the batch (`start`) once the rows' matchers have consumed the tokens the
forward is about to write, then runs the forward: llguidance drops the GIL while it fills the
masks and the C++ CPU forward (or the GPU) drops it too, so the two overlap. The sampler joins
(`wait`) and reads each row's mask (`take`); rows without a constraint never touch this.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import llguidance as llg
import torch

from met.constraints.state import SequenceGrammar


class MaskPrefetch:
    def __init__(self, n_vocab: int) -> None:
        self.words = (n_vocab + 31) // 32
        self._executor: llg.LLExecutor | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._buffer = torch.empty((0, self.words), dtype=torch.int32)
        # Request id -> (buffer row, the state as it was when its mask was computed).
        self._rows: dict[int, tuple[int, int, int]] = {}

    def start(self, states: dict[int, SequenceGrammar]) -> None:
        """Fills the next mask of each state (by request id) in the background."""
        self.wait()
        live = {rid: s for rid, s in states.items() if not s.free}
        self._rows = {
            rid: (i, id(s.matcher), len(s.consumed)) for i, (rid, s) in enumerate(live.items())
        }
        if not live:
            return
        if self._pool is None:
            self._executor = llg.LLExecutor()
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="met-grammar-masks")
        self._buffer = torch.empty((len(live), self.words), dtype=torch.int32)
        pairs = [(s.matcher, i) for i, s in enumerate(live.values())]
        self._pending = self._pool.submit(
            self._executor.unsafe_compute_mask_ptr,
            pairs,
            self._buffer.data_ptr(),
            self.words * 4,
            len(live),
        )

    def wait(self) -> None:
        """Joins the batch in flight (its matchers may be read or moved on only after this)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def take(self, rid: int, state: SequenceGrammar) -> torch.Tensor | None:
        """The int32 bitmask row [words] of the state's next token (None: unconstrained). A
        state that moved since its mask was started (a resync) gets its mask computed now."""
        self.wait()
        if state.free:
            return None
        where = self._rows.get(rid)
        if where is not None and where[1:] == (id(state.matcher), len(state.consumed)):
            return self._buffer[where[0]]
        row = torch.empty(self.words, dtype=torch.int32)
        state.matcher.unsafe_compute_mask_ptr(row.data_ptr(), self.words * 4)
        return row

    def close(self) -> None:
        self.wait()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
