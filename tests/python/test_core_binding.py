"""A Python subclass of _core.Backend drives the C++ Scheduler end to end, preemption included."""

from __future__ import annotations

import pytest

from met import _core


class ToyBackend(_core.Backend):
    """Answers every forward row with `last input token + 1` (capped at the stop token 63)."""

    def __init__(self, fail_decode_at: set[int]):
        super().__init__()
        self.free_slots: list[int] = []
        self.next_slot = 0
        self.rows: list[int] = []
        self.decode_calls = 0
        self.fail_decode_at = fail_decode_at
        self.preempted = 0
        self.starts: list[tuple[int, int]] = []  # (decode row start, tokens written before it)

    def open(self):
        return _core.DeviceInfo(vocab=64, block_size=16, total_blocks=1000)

    def num_free_blocks(self):
        return 1000

    def _take_slot(self, seq):
        if self.free_slots:
            seq.slot = self.free_slots.pop(self.free_slots.index(min(self.free_slots)))
        else:
            seq.slot = self.next_slot
            self.next_slot += 1

    def alloc_sequence(self, seq, budget):
        self._take_slot(seq)

    def free_sequence(self, seq):
        self.free_slots.append(seq.slot)
        seq.block_table = []

    def compact_sequence(self, seq, new_slot):
        self.free_slots.remove(new_slot)
        self.free_slots.append(seq.slot)
        seq.slot = new_slot

    def _advance(self, seq, tokens):
        seq.tokens = seq.tokens + list(tokens)
        seq.seq_len = len(seq.tokens)
        seq.block_table = list(range(seq.seq_len // 16 + 1))
        return min(seq.tokens[-1] + 1, 63)

    def execute(self, plan):
        if plan.call == _core.ReferenceCall.DecodeBatch:
            index = self.decode_calls
            self.decode_calls += 1
            if index in self.fail_decode_at:
                self.preempted += 1
                raise _core.KvExhausted()
        rows = []
        for row in plan.rows:
            if row.kind == _core.RowKind.Decode:
                self.starts.append((row.start, len(row.seq.tokens)))
            rows.append(self._advance(row.seq, row.tokens))
        self.rows = rows
        return list(rows) if plan.argmax else []

    def argmax_on_device(self, row, stream):
        return self.rows[row]

    def argmax_batch(self, row, n, stream):
        return self.rows[row : row + n]

    def copy_logits_to_host(self, row, n):
        assert row + n <= len(self.rows)

    def sample_rows(self, rows):
        return [_core.SampledToken(self.rows[r.row]) for r in rows]


def run(backend: ToyBackend, prefill_tokens: int) -> dict[int, list]:
    config = _core.SchedulerConfig(max_prefill_tokens=prefill_tokens)
    sched = _core.Scheduler(backend, config)
    sched.add_request(_core.Request(1, [1, 3, 58, 59, 60]))
    params = _core.SamplingParams()
    params.max_tokens = 5
    sched.add_request(_core.Request(2, [2, 3, 4, 5, 6, 7, 50], params))
    events: dict[int, list] = {1: [], 2: []}
    now = 0.0
    while True:
        now += 1.0
        if not sched.has_work():
            sched.close_inbox()
        result = sched.tick(now)
        for e in sched.take_events():
            events[e.request_id].append(e)
        if result.shutdown:
            return events
        assert now < 100


@pytest.mark.parametrize("prefill_tokens", [0, 4])
def test_python_backend_drives_the_scheduler_with_a_preemption(prefill_tokens):
    backend = ToyBackend(fail_decode_at={1})
    events = run(backend, prefill_tokens)
    assert backend.preempted == 1
    tokens = {
        rid: [e.token.token for e in evs if e.kind == _core.ClientEvent.Kind.Token]
        for rid, evs in events.items()
    }
    assert tokens[1] == [61, 62]
    assert tokens[2] == [51, 52, 53, 54, 55]
    done = {rid: evs[-1] for rid, evs in events.items()}
    assert (done[1].finish_reason, done[1].n, done[1].output) == ("stop", 3, [61, 62, 63])
    assert (done[2].finish_reason, done[2].n, done[2].guard) == ("length", 5, None)
    # A decode row's start is the seq_len C++ reads after the Python execute wrote it: had the
    # trampoline passed copies, C++ would still see 0.
    assert backend.starts and all(start == written for start, written in backend.starts)
    assert min(start for start, _ in backend.starts) >= 5


class LedgerToy(ToyBackend):
    """The same answers, keeping no KV state: the scheduler's block manager does (KvLedger)."""

    def __init__(self, block_size: int) -> None:
        super().__init__(fail_decode_at=set())
        self.block_size = block_size
        self.calls: list[_core.ReferenceCall] = []

    def open(self):
        # More blocks than the pool holds, so admission lets both requests in and decode runs out.
        return _core.DeviceInfo(vocab=64, block_size=self.block_size, total_blocks=1000)

    def free_sequence(self, seq):
        assert seq.block_table == []  # released by the scheduler before the slot
        self.free_slots.append(seq.slot)

    def execute(self, plan):
        self.calls.append(plan.call)
        rows = []
        for row in plan.rows:
            # Each row arrives with its blocks and its history; nothing here advances them.
            assert len(row.seq.block_table) * self.block_size >= row.start + len(row.tokens)
            assert len(row.seq.tokens) == row.start
            rows.append(min(row.tokens[-1] + 1, 63))
        self.rows = rows
        return list(rows) if plan.argmax else []


@pytest.mark.parametrize("prefill_tokens", [0, 4])
def test_the_scheduler_owns_the_kv_blocks_through_a_preemption(prefill_tokens):
    blocks = _core.BlockManager(4, 4)
    backend = LedgerToy(block_size=4)
    config = _core.SchedulerConfig(max_prefill_tokens=prefill_tokens)
    sched = _core.Scheduler(backend, config, blocks)
    params = _core.SamplingParams()
    params.max_tokens = 6
    sched.add_request(_core.Request(1, [1, 2, 3, 4, 5], params))
    sched.add_request(_core.Request(2, [20, 21, 22, 23, 24], params))
    sched.close_inbox()
    done = {}
    for now in range(1, 100):
        result = sched.tick(float(now))
        done.update({e.request_id: e for e in sched.take_events() if e.kind.name == "Done"})
        if result.shutdown:
            break
    assert done[1].output == [6, 7, 8, 9, 10, 11] and done[2].output == list(range(25, 31))
    # A preempted sequence is prefilled again whole (a Prefill plan) when it resumes.
    first_prefills = 2 if prefill_tokens == 0 else 0
    assert backend.calls.count(_core.ReferenceCall.Prefill) > first_prefills
    assert blocks.num_free_blocks() == 4
    blocks.check_invariants()
