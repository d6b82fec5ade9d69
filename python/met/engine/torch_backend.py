"""The real device behind the C++ scheduler: a torch model over a paged KV cache.

The scheduler decides what runs and owns the KV blocks (its KvLedger over the C++ block manager,
keyed by the sequence's request id): each tick's StepPlan arrives with every row's block table
grown, and this backend runs it as one packed batched forward. The token history is the
sequence's own (Sequence.tokens), read only where a row needs it (penalties, grammars, a
hybrid's checkpoints). Run it under a Scheduler built with the same block manager.
"""

from __future__ import annotations

import ctypes
import math
from contextlib import AbstractContextManager, nullcontext

import torch

from met import _core
from met.constraints import MaskPrefetch, SequenceGrammar
from met.engine.forward_rows import Row, pack_rows, plan_rows
from met.engine.prompt_logprobs import PromptScores
from met.model.sampler import SampleSpec, draw, draw_params, sample


class TorchBackend(_core.Backend):
    def __init__(
        self,
        model,
        kv_cache,
        block_manager: _core.BlockManager,
        max_slots: int,
        checkpoints: _core.StateCheckpoints | None = None,
    ) -> None:
        _core.Backend.__init__(self)
        self.model = model
        self.kv_cache = kv_cache
        self.blocks = block_manager
        self._free_slots = list(range(max_slots - 1, -1, -1))  # sorted descending; pop = lowest
        self._logits: torch.Tensor | None = None
        # The stream the last forward ran on. Reading its logits (argmax, sampling) runs there
        # too, so the reads queue behind the forward: on a GPU the streams are non-blocking and
        # torch's default stream would not wait for them.
        self._logits_stream = 0
        # Each logits row's argmax when the forward found them already: a list from the C++ CPU
        # forward, a device tensor from the GPU one (read back on first use).
        self._greedy: list[int] | torch.Tensor | None = None
        # Structured-output requests' grammar states by request id (the engine adds and drops
        # them: they outlive a preempted sequence), and their next masks, computed while the
        # forward runs.
        self.constraints: dict[int, SequenceGrammar] = {}
        self.masks = MaskPrefetch(model.config.vocab)
        # Prompt-logprob requests' scores by request id (the engine adds them, and takes them
        # with the first token).
        self.prompt_scores: dict[int, PromptScores] = {}
        # Where chat requests' rendered histories end in their prompts, by request id (the engine
        # adds them from SamplingParams.history_end; a hybrid's checkpoints read them).
        self.history_ends: dict[int, int] = {}
        self.streams = _cuda_streams(model.device)
        # The C++ CPU forward and the GPU one pack rows themselves (CpuLlama / CudaLlama).
        self._forward_rows = getattr(model, "forward_rows", None)
        # Plain rows (SampleRow.plain_draw) skip the host sampler's adjustments: the GPU forward
        # draws them with met's sampling kernel (CudaLlama.kernel_sample), any other with met's
        # host draw, the one the host sampler ends in.
        self._kernel_sample = getattr(model, "kernel_sample", None) or draw
        # A hybrid model's recurrent state per slot (model/deltanet.py); None for attention only.
        self._state = getattr(kv_cache, "state", None)
        # Its prefix cache's recurrent-state checkpoint index (the core's, engine/hybrid.py
        # builds it; this backend copies the states it names); None: no prefix cache or no
        # recurrent layers.
        self.checkpoints = checkpoints
        self._marks: list[int] = []  # the checkpoints of the forward being run, flat triples

    # --- silent queries ---
    def open(self) -> _core.DeviceInfo:
        """The prefill stream and its event are real on a GPU; on the CPU the scheduler's ids
        are labels only and it never asks to join or synchronize them."""
        vocab, block_size = self.model.config.vocab, self.blocks.block_size()
        total = self.blocks.num_total_blocks()
        if not self.streams:
            return _core.DeviceInfo(vocab, block_size, total)
        stream, event = self.streams.create_stream(), self.streams.create_event()
        return _core.DeviceInfo(vocab, block_size, total, True, stream, event)

    def num_free_blocks(self) -> int:
        return self.blocks.num_free_blocks()

    def match_prefix(self, seq: _core.Sequence, prompt: list[int]) -> int:
        """The core's block manager matches plain prompts; a prompt being scored is computed
        whole (cached positions would have no logits), and a hybrid's prefix resumes only from a
        recurrent-state checkpoint."""
        if seq.session_hash in self.prompt_scores:
            return 0
        if self.checkpoints is not None:
            resumed = self.checkpoints.resume(seq.session_hash, prompt)
            if resumed.index >= 0:
                self._state.restore_checkpoint(resumed.index, seq.state_slot)
            return resumed.length
        return _core.MATCH_IN_CORE

    # --- streams and events: called only on a GPU (DeviceInfo.streams) ---
    def join_streams(self, event: int, recorded: int, waiting: int) -> None:
        self.streams.record_event(event, recorded)
        self.streams.stream_wait_event(waiting, event)

    def synchronize(self, stream: int) -> None:
        self.streams.synchronize(stream)

    def _on(self, stream: int) -> AbstractContextManager:
        return self.streams.use(stream) if self.streams else nullcontext()

    def for_scheduler(self) -> _core.Backend:
        """The backend the scheduler runs over: this one, or for a model on the C++ CPU forward a
        DirectForward around it, which runs the decode and verify steps without a grammar row
        itself: a greedy one never calls back into Python, a sampled one only to sample
        (sample_logits). A hybrid's steps there keep its checkpoint index and recurrent state
        as this backend's would (the state copies are made in C++)."""
        forward = getattr(self.model, "direct_forward", None)
        if forward is None:
            return self
        return _core.cpu.DirectForward(self, forward, self.checkpoints)

    # --- sequences ---
    def alloc_sequence(self, seq: _core.Sequence, budget: int) -> None:
        """A hybrid model's sequence comes with its state slot (the scheduler's StatePool), which
        starts from zero."""
        seq.slot = self._free_slots.pop()
        if self._state is not None:
            self._state.reset([seq.state_slot])

    def free_sequence(self, seq: _core.Sequence) -> None:
        """The scheduler released the sequence's blocks already; its slot is this backend's."""
        self._release_slot(seq.slot)
        if self.checkpoints:
            self.checkpoints.forget(seq.session_hash)

    def compact_sequence(self, seq: _core.Sequence, new_slot: int) -> None:
        if new_slot == seq.slot:
            return
        self._free_slots.remove(new_slot)
        self._release_slot(seq.slot)
        seq.slot = new_slot  # a recurrent state stays in its state slot

    def _release_slot(self, slot: int) -> None:
        self._free_slots.append(slot)
        self._free_slots.sort(reverse=True)

    # --- the forward ---
    def execute(self, plan: _core.StepPlan) -> list[int]:
        """One packed forward of the plan's rows. Its verify rows (first in the plan) get a
        logits row per position: the packed forward computes each token's row on its own, so a
        verify position's logits are the ones a one-token decode at that position would give."""
        rows, tables, spread = plan_rows(plan)
        self._forward(plan, rows, tables, spread)
        return self._argmax_rows() if plan.argmax else []

    def commit_accepted_prefix(self, seq: _core.Sequence, na: int, k: int) -> None:
        """Called when a draft was rejected (the scheduler rolled the KV back already)."""
        if self._state is not None:
            # The recurrent state ran over every draft; put back the one after the last that
            # stands (the verify forward kept each token's).
            self._state.restore(seq.state_slot, na)

    def _forward(
        self, plan: _core.StepPlan, rows: list[Row], tables: list[list[int]], spread: int
    ) -> None:
        if self.constraints:
            self._prefetch_masks(rows)
        self._logits_stream = plan.stream
        # A hybrid's state checkpoints this forward writes (_pack, forward_rows read them).
        self._marks = self.checkpoints.plan(plan, self.history_ends) if self.checkpoints else []
        try:
            self._run_rows(rows, tables, plan.stream, spread)
        except BaseException:
            if self.checkpoints:
                self.checkpoints.abandon()
            raise
        if self.checkpoints:
            # The rows that reached a block boundary in decode leave their state there.
            for copy in self.checkpoints.commit(plan):
                token = None if copy.token < 0 else copy.token
                self._state.checkpoint(copy.index, copy.slot, token)

    def _run_rows(self, rows: list[Row], tables: list[list[int]], stream: int, spread: int) -> None:
        with self._on(stream):
            scored = self._scored_rows(rows)
            if scored:
                self._logits = self._score_prompts(rows, tables, scored, spread)
                self._greedy = None
            elif self._forward_rows is not None:
                self._logits, self._greedy = self._forward_rows(
                    [row.tokens for row in rows],
                    [row.start for row in rows],
                    tables,
                    spread,
                    **self._row_state(rows),
                )
            else:
                self._logits = self._run_model(self._pack(rows, tables, spread))
                self._greedy = None

    def _row_state(self, rows: list[Row]) -> dict[str, list]:
        """A hybrid's rows carry their recurrent state slots, verify flags and checkpoints."""
        if self._state is None:
            return {}
        return {
            "state_slots": [row.seq.state_slot for row in rows],
            "state_checkpoints": self._marks,
            "verify": [row.draft for row in rows],
        }

    def _scored_rows(self, rows: list[Row]) -> dict[int, PromptScores]:
        """Rows (by index) whose every position's logits score a prompt."""
        if not self.prompt_scores:
            return {}
        out = {}
        for i, row in enumerate(rows):
            scores = self.prompt_scores.get(row.seq.session_hash)
            if scores is not None and scores.wants(row.start, len(row.tokens)):
                out[i] = scores
        return out

    def _score_prompts(
        self,
        rows: list[Row],
        tables: list[list[int]],
        scored: dict[int, PromptScores],
        spread: int,
    ) -> torch.Tensor:
        """One forward with logits of every position of the scored rows and of the first
        `spread` (verify) rows, the last position of the others; feeds the scores and returns
        the verify rows' every position and the other rows' last-position logits."""
        inputs = self._pack(rows, tables)
        cu = inputs["cu_seqlens"].tolist()
        wanted, keep, spans = [], [], {}
        for i in range(len(rows)):
            first = cu[i] if i in scored or i < spread else cu[i + 1] - 1
            at = len(wanted)
            wanted.extend(range(first, cu[i + 1]))
            spans[i] = (at, len(wanted))
            keep.extend(range(at, len(wanted)) if i < spread else [len(wanted) - 1])
        inputs["logits_rows"] = torch.tensor(wanted, dtype=torch.int64, device=self.model.device)
        logits = self._run_model(inputs)
        for i, scores in scored.items():
            scores.add(rows[i].start, logits[spans[i][0] : spans[i][1]])
        return logits[torch.tensor(keep, device=logits.device)]

    def _prefetch_masks(self, rows: list[Row]) -> None:
        """Each constrained row's matcher takes the output this forward writes (a decode row's
        first token is the one sampled last step; draft tokens after it are not output yet),
        then its next masks start computing."""
        jobs = []
        for row in rows:
            rid = row.seq.session_hash
            state = self.constraints.get(rid)
            if state is None:
                continue
            new, prompt_len = row.tokens[: 1 if row.draft else None], row.seq.prompt_len
            if row.start + len(new) < prompt_len:
                continue  # a prompt chunk: no output yet
            # The output so far: what follows the prompt in the history (it holds the tokens
            # before row.start), then what follows it in this row.
            output = row.seq.tokens_from(prompt_len) + new[max(0, prompt_len - row.start) :]
            state.sync(output)
            jobs.append((rid, state, row.tokens[1:] if row.draft else []))
        self.masks.start(jobs)

    def _run_model(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model.forward(self.kv_cache, **inputs)

    def _pack(
        self, rows: list[Row], tables: list[list[int]], spread: int = 0
    ) -> dict[str, torch.Tensor]:
        inputs = pack_rows(rows, tables, self.blocks.block_size(), self.model.device, spread)
        if self._state is not None:
            slots = [row.seq.state_slot for row in rows]
            inputs["state_slots"] = torch.tensor(slots, device=self.model.device)
            if any(row.draft for row in rows):
                drafts = [row.draft for row in rows]
                inputs["verify_rows"] = torch.tensor(drafts, device=self.model.device)
            if self._marks:
                inputs["state_checkpoints"] = torch.tensor(self._marks).view(-1, 3)
        return inputs

    # --- readback ---
    def argmax_on_device(self, row: int, stream: int) -> int:
        return self.argmax_batch(row, 1, stream)[0]

    def argmax_batch(self, row: int, n: int, stream: int) -> list[int]:
        return self._argmax_rows(row, row + n)

    def _argmax_rows(self, start: int = 0, stop: int | None = None) -> list[int]:
        with self._on(self._logits_stream):
            if isinstance(self._greedy, torch.Tensor):
                self._greedy = self._greedy.tolist()  # the step's one wait for the device
            if self._greedy is not None:
                return self._greedy[start:stop]
            return self._logits[start:stop].argmax(dim=-1).tolist()

    def sample_rows(self, rows: list[_core.SampleRow]) -> list[_core.SampledToken]:
        with self._on(self._logits_stream):
            return self._sample_rows(rows)

    def sample_logits(
        self, address: int, n_logits: int, vocab: int, rows: list[_core.SampleRow]
    ) -> list[_core.SampledToken]:
        """Host sampling of the logits a DirectForward step wrote in C++ memory ([n_logits,
        vocab] float32 at `address`, valid for this call only), viewed without a copy."""
        view = (ctypes.c_float * (n_logits * vocab)).from_address(address)
        self._logits = torch.frombuffer(view, dtype=torch.float32).view(n_logits, vocab)
        self._greedy = None
        try:
            return self._sample_rows(rows)
        finally:
            self._logits = None  # the memory is the forward's again

    def _sample_rows(self, rows: list[_core.SampleRow]) -> list[_core.SampledToken]:
        self.masks.wait()  # the matchers are read below
        out: list[_core.SampledToken | None] = [None] * len(rows)
        plain = [i for i, r in enumerate(rows) if r.plain_draw]
        if plain:
            picked = [rows[i] for i in plain]
            params = draw_params([r.params for r in picked], [r.n_generated for r in picked])
            draws = self._kernel_sample(self._logits, [r.row for r in picked], params)
            # No logprob was asked for these rows, so none is computed.
            for i, token in zip(plain, draws.tolist(), strict=True):
                out[i] = _core.SampledToken(token, math.nan, [])
        rest = [i for i in range(len(rows)) if out[i] is None]
        if rest:
            index = torch.tensor([rows[i].row for i in rest], device=self._logits.device)
            specs = [self._sample_spec(rows[i]) for i in rest]
            picks = sample(self._logits.index_select(0, index), specs)
            for i, p in zip(rest, picks, strict=True):
                out[i] = _core.SampledToken(p.token, p.logprob, p.top)
        return out

    def _sample_spec(self, row: _core.SampleRow) -> SampleSpec:
        state = self.constraints.get(row.request_id)
        # Sequence.tokens is copied out on each read: only what needs the history reads it.
        history = row.seq.tokens if state is not None or _penalized(row.params) else []
        mask = None
        if state is not None:
            # The output is what follows the prompt (also after a preempted sequence was
            # prefilled again with its output; a verify row's history also holds its drafts).
            start = row.seq.prompt_len
            mask = self.masks.take(row.request_id, state, history[start : start + row.n_generated])
        return SampleSpec(
            params=row.params,
            history=history,
            prompt_len=row.seq.prompt_len,
            n_generated=row.n_generated,
            mask_stop=row.mask_stop,
            stop_tokens=list(row.stop_tokens),
            mask=mask,
        )


def _penalized(params: _core.SamplingParams) -> bool:
    return (
        params.repetition_penalty != 1.0
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
    )


def _cuda_streams(device: torch.device):
    """The core's decode/prefill streams and event on a GPU built with CUDA; None elsewhere."""
    if device.type != "cuda" or not _core.has_cuda():
        return None
    from met.kernels.cuda_streams import CudaStreams

    return CudaStreams(device.index or 0)
