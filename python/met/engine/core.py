"""The synchronous engine: model + KV pool + C++ scheduler, stepped by one thread at a time."""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

from met import _core
from met.config import EngineConfig
from met.constraints import ModelGrammar
from met.engine.capacity import plan_capacity
from met.engine.hybrid import hybrid_off, state_checkpoints
from met.engine.kv_budget import kv_dtype
from met.engine.output import RequestOutputState
from met.engine.outputs import CompletionDelta, EngineStats, SpecStats, TokenLogprob
from met.engine.pooling import pooler_for
from met.engine.prompt_logprobs import PromptScores
from met.engine.torch_backend import TorchBackend
from met.hub import served_name
from met.model.capability import cannot_run
from met.model.cpu_llama import cpu_forward_for
from met.model.cuda_llama import cuda_forward_for
from met.models import load_model, resolve_model
from met.parallel.experts import NEEDS_RANKS, ExpertSplitError, describe_split
from met.sampling import SamplingParams

log = logging.getLogger("met.engine")

# max_num_seqs when not set, by device type (config.py says why they differ).
_DEFAULT_MAX_NUM_SEQS = {"cpu": 8, "cuda": 64}
_TOKEN = _core.ClientEvent.Kind.Token
SPECULATIVE = {
    "off": _core.SpecMode.Off,
    "ngram": _core.SpecMode.Ngram,
    "ngram-forced": _core.SpecMode.NgramForced,
}


@dataclass
class _Live:
    """A request the engine has handed to the scheduler and not yet finished."""

    state: RequestOutputState
    started: float


class EngineCore:
    def __init__(
        self, config: EngineConfig, progress: Callable[[str, int, int], None] | None = None
    ) -> None:
        self.config = config
        self.model_path = resolve_model(config.model)
        self.hub_name = served_name(config.model, self.model_path)
        self.model_config, self.model, self.tokenizer = load_model(
            self.model_path,
            dtype=config.dtype,
            device=config.device,
            progress=progress,
            shard=_rank0_shard(config.tensor_parallel_size, config.enable_expert_parallel),
            weight_format=config.weight_format,
        )
        if config.max_num_seqs is None:
            config.max_num_seqs = _DEFAULT_MAX_NUM_SEQS[self.model.device.type]
        self.max_model_len = min(
            config.max_model_len or self.model_config.context_length,
            self.model_config.context_length,
        )
        cpp_forward = (
            self.model.device.type == "cpu"
            and config.tensor_parallel_size == 1
            and cannot_run(self.model, "cpu") is None
        )
        self.kv_dtype = kv_dtype(config.kv_cache_dtype, self.model.dtype, cpp_forward)
        self.capacity = plan_capacity(
            config, self.model_config, self.model, self.kv_dtype, self.max_model_len
        )
        num_blocks = self.capacity.kv_blocks
        kv_cache = self.model.allocate_kv_cache(
            num_blocks, config.block_size, self.kv_dtype, state_slots=config.max_num_seqs
        )
        hybrid_off(self.model, config)
        # The CPU pool commits memory page by page as blocks are first written (PagedKvCache):
        # reusing cached blocks before touching new ones keeps its resident size at the peak in
        # use instead of growing with every token served.
        self.blocks = _core.BlockManager(
            num_blocks,
            config.block_size,
            config.enable_prefix_cache,
            reuse_before_fresh=self.model.device.type == "cpu",
        )
        self._parallel = None
        # How the model is split over the ranks, for the start-up log; None for one process.
        self.split = describe_split(
            self.model_config, config.tensor_parallel_size, config.enable_expert_parallel
        )
        self.backend = self._make_backend(kv_cache, num_blocks)
        self.pooler = pooler_for(self.config, self.model_path, self.model, kv_cache, self.blocks)
        # The scheduler owns the KV bookkeeping over the backend's forwards (C++ KvLedger); on
        # the C++ CPU forward it runs decode steps itself (DirectForward).
        self.scheduler_backend = self.backend.for_scheduler()
        settings = self._scheduler_config()
        # A hybrid model's recurrent-state slots, held by the scheduler beside the KV blocks.
        state = getattr(kv_cache, "state", None)
        self.states = None if state is None else _core.StatePool(state.n_slots)
        self.scheduler = _core.Scheduler(self.scheduler_backend, settings, self.blocks, self.states)
        self._ids = itertools.count(1)
        self._live: dict[int, _Live] = {}
        self._by_name: dict[str, int] = {}
        self.generated_tokens_total = 0
        # Finished requests that ran without speculation, by reason (met_spec_requests_off_total).
        self.spec_off_requests: Counter[str] = Counter()
        # Structured output's tokenizer and compiled grammars, built on the first request asking.
        self.grammar = ModelGrammar(self.tokenizer, self.model_config.vocab)
        _return_free_heap()

    def _make_backend(self, kv_cache, num_blocks: int) -> TorchBackend:
        if self.config.tensor_parallel_size == 1:
            forward = _fast_forward(self.model, kv_cache, self.max_model_len, self.config)
            checkpoints = state_checkpoints(kv_cache, self.blocks, self.config)
            return TorchBackend(
                forward, kv_cache, self.blocks, self.config.max_num_seqs, checkpoints
            )
        from met.parallel.dist import start_rank0
        from met.parallel.tp_backend import TensorParallelBackend

        setup = {
            "config": asdict(self.config),
            "model_path": str(self.model_path),
            "num_blocks": num_blocks,
        }
        group = start_rank0(self.config.tensor_parallel_size, self.model.device, setup)
        self.model.reduce = group.all_reduce
        self._parallel = TensorParallelBackend(
            self.model, kv_cache, self.blocks, self.config.max_num_seqs, group
        )
        return self._parallel

    def _scheduler_config(self) -> _core.SchedulerConfig:
        cfg = _core.SchedulerConfig()
        cfg.max_batch_size = self.config.max_num_seqs
        cfg.max_prefill_tokens = self.config.max_prefill_tokens
        cfg.max_batch_tokens = self.config.max_batch_tokens
        cfg.max_seq_len = self.max_model_len
        cfg.eos_tokens = list(self.tokenizer.eos_token_ids)
        cfg.speculative = self._spec_mode = self._speculative()
        cfg.num_speculative_tokens = self.config.num_speculative_tokens
        return cfg

    def _speculative(self) -> _core.SpecMode:
        setting = self.config.speculative
        if setting not in SPECULATIVE:
            raise ValueError(f"speculative: {', '.join(SPECULATIVE)}; not {setting!r}")
        if self.config.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens: must be at least 1")
        # The worker ranks mirror rank 0's forwards call by call and have no verify forward; the
        # GPU forward's bit-identity of verify rows with one-token decode (what keeps output
        # unchanged) has not been checked on a device yet.
        where = "tensor parallelism" if self.config.tensor_parallel_size > 1 else "a GPU"
        if self.config.tensor_parallel_size > 1 or self.model.device.type == "cuda":
            # The gated default says nothing: only a mode asked for is worth a warning.
            if setting == "ngram-forced":
                log.warning("speculative %s is off with %s (docs/speculative.md)", setting, where)
            elif setting == "ngram":
                log.info("speculative ngram is off with %s (docs/speculative.md)", where)
            return _core.SpecMode.Off
        return SPECULATIVE[setting]

    @property
    def model_name(self) -> str:
        if self.hub_name is not None:  # its snapshot folder's name is a commit hash
            return self.hub_name
        return (
            self.model_path.stem.split(".")[0]
            if self.model_path.is_file()
            else self.model_path.name
        )

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Validates a request; returns the max_tokens it will run with (clamped to the context)."""
        params.validate(self.model_config.vocab)
        if params.constraint is not None:
            self.grammar.check(params.constraint)
        n_prompt = len(prompt_token_ids)
        if n_prompt == 0:
            raise ValueError("prompt: must not be empty")
        if any(not 0 <= t < self.model_config.vocab for t in prompt_token_ids):
            raise ValueError("prompt: token ids must be inside the vocabulary")
        room = self.max_model_len - n_prompt
        if room <= 0:
            raise ValueError(
                f"prompt: this model's maximum context length is {self.max_model_len} tokens, "
                f"but the prompt has {n_prompt} tokens"
            )
        if params.max_tokens == 0:
            return 1  # a prompt-scoring request: the one token the core samples is dropped
        return min(params.max_tokens or room, room)

    def add_request(
        self,
        name: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        timeout_s: float | None = None,
    ) -> None:
        max_tokens = self.check_request(prompt_token_ids, params)
        rid = next(self._ids)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        request = _core.Request(
            rid, list(prompt_token_ids), _core_params(params, max_tokens), deadline=deadline
        )
        state = RequestOutputState(name, len(prompt_token_ids), params, self.tokenizer)
        if params.constraint is not None:
            self.backend.constraints[rid] = self.grammar.start(params.constraint)
        if params.prompt_logprobs is not None:
            self.backend.prompt_scores[rid] = PromptScores(prompt_token_ids, params.prompt_logprobs)
        if params.history_end is not None:
            self.backend.history_ends[rid] = params.history_end
        self._live[rid] = _Live(state, time.monotonic())
        self._by_name[name] = rid
        self.scheduler.add_request(request)

    def abort(self, name: str) -> None:
        """Ends a request whose caller is gone; its KV blocks are freed by the next tick."""
        rid = self._by_name.get(name)
        if rid is not None:
            self.scheduler.abort_request(rid)
            self._forget(rid)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[CompletionDelta]:
        """Runs one scheduler tick and returns the deltas it produced, in event order."""
        self.scheduler.tick(time.monotonic())
        deltas = []
        live = self._live
        for event in self.scheduler.take_events():
            request = live.get(event.request_id)
            if request is None:
                continue
            if event.kind == _TOKEN:
                delta = self._on_token(event, request.state)
            else:
                delta = self._on_end(event, request.state)
            if delta is not None:
                deltas.append(delta)
        return deltas

    def _on_token(self, event, state: RequestOutputState) -> CompletionDelta | None:
        """Runs once per generated token of every request: kept to the few reads it needs."""
        if state.finished:
            return None
        rid = event.request_id
        state.cached_tokens = event.cached
        params = state.params
        scores = self.backend.prompt_scores.pop(rid, None) if self.backend.prompt_scores else None
        if params.max_tokens == 0:
            delta = state.on_done("length", 0, state.cached_tokens)
        else:
            self.generated_tokens_total += 1
            logprob = None if params.logprobs is None else _logprob(event)
            delta = state.on_token(event.token_id, logprob)
        if scores is not None:
            delta.prompt_logprobs = scores.entries
        if delta.finished:
            self.scheduler.abort_request(rid)
            self._forget(rid)
        return delta

    def _on_end(self, event, state: RequestOutputState) -> CompletionDelta | None:
        self._forget(event.request_id)
        kind = event.kind
        if kind == _core.ClientEvent.Kind.Done and event.spec_off:
            self.spec_off_requests[event.spec_off] += 1
        if state.finished:
            return None
        if kind == _core.ClientEvent.Kind.Done:
            return state.on_done(event.finish_reason, event.n, event.cached)
        return state.on_done("error", state.completion_tokens, state.cached_tokens)

    def _forget(self, rid: int) -> None:
        self.backend.constraints.pop(rid, None)
        self.backend.prompt_scores.pop(rid, None)
        self.backend.history_ends.pop(rid, None)
        live = self._live.pop(rid, None)
        if live is not None:
            self._by_name.pop(live.state.request_id, None)

    def stats(self) -> EngineStats:
        sched = self.scheduler.stats()
        now = time.monotonic()
        requests = [
            {
                "id": live.state.request_id,
                "prompt_tokens": live.state.prompt_len,
                "generated_tokens": live.state.completion_tokens,
                "age_s": now - live.started,
            }
            for live in self._live.values()
        ]
        return EngineStats(
            num_running=sched.running + sched.prefilling,
            num_waiting=sched.waiting + sched.requeued,
            kv_blocks_used=self.blocks.num_used_blocks(),
            kv_blocks_total=self.blocks.num_total_blocks(),
            kv_block_size=self.blocks.block_size(),
            prefix_cache_queried_tokens=self.blocks.prefix_queried_tokens(),
            prefix_cache_hit_tokens=self.blocks.prefix_hit_tokens(),
            generated_tokens_total=self.generated_tokens_total,
            preemptions=sched.preemptions,
            requests=requests,
            speculation=self._spec_stats(),
        )

    def _spec_stats(self) -> SpecStats | None:
        if self._spec_mode == _core.SpecMode.Off:
            return None
        s = self.scheduler.spec_stats()
        return SpecStats(
            mode=self.config.speculative,
            drafted=s.drafted,
            accepted=s.accepted,
            verify_steps=s.verify_steps,
            verify_rows=s.verify_rows,
            withheld=s.withheld,
            gate_switches=s.gate_switches,
            gate_probes=s.gate_probes,
            proposer_seconds=s.proposer_seconds,
            gate_plain_buckets=list(s.gate_plain_buckets),
            requests_off=dict(self.spec_off_requests),
        )

    def idle(self) -> None:
        """Call between ticks while there is nothing to run: a tensor-parallel engine checks on
        its workers, so one that died fails the engine within seconds even with no traffic."""
        if self._parallel is not None:
            self._parallel.heartbeat()

    def abort_all(self) -> None:
        for live in list(self._live.values()):
            self.abort(live.state.request_id)

    def shutdown(self) -> None:
        """Finishes what runs; the scheduler's shutdown word then stops any workers."""
        self.scheduler.close_inbox()
        while not self.scheduler.tick(time.monotonic()).shutdown:
            self.scheduler.take_events()
        if self._parallel is not None:
            self._parallel.close(clean=True)

    def abandon(self) -> None:
        """After a failure: stops the workers this process spawned (no-op otherwise)."""
        if self._parallel is not None:
            self._parallel.close(clean=False)


def _return_free_heap() -> None:
    """Hands the heap that loading freed back to the OS (glibc keeps freed pages for reuse):
    the GGUF reader's metadata and the conversion buffers are gone by now, and an idle server
    would otherwise keep them resident (about 35 MB with the default model)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to ask
        return
    libc.malloc_trim(0)


def _fast_forward(model, kv_cache, max_model_len: int, config: EngineConfig):
    """The forward a single-process engine runs: met's kernels (C++ on the CPU, CUDA on a GPU)
    whenever the model allows them, else the torch model itself."""
    if model.device.type == "cuda":
        return cuda_forward_for(
            model, kv_cache, max_model_len, config.max_num_seqs, eager=config.enforce_eager
        )
    return cpu_forward_for(model, kv_cache)


def _rank0_shard(world: int, expert_parallel: bool):
    if world < 1:
        raise ValueError(f"tensor_parallel_size: must be at least 1, got {world}")
    if expert_parallel and world == 1:
        raise ExpertSplitError(NEEDS_RANKS)
    if world == 1:
        return None
    from met.parallel.shard import shard_weights

    return partial(shard_weights, rank=0, world=world, expert_parallel=expert_parallel)


def _core_params(params: SamplingParams, max_tokens: int) -> _core.SamplingParams:
    out = _core.SamplingParams()
    out.temperature = 0.0 if params.greedy else params.temperature
    out.top_k = max(params.top_k, 0)
    out.top_p = params.top_p
    out.min_p = params.min_p
    out.seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
    out.repetition_penalty = params.repetition_penalty
    out.presence_penalty = params.presence_penalty
    out.frequency_penalty = params.frequency_penalty
    out.logit_bias = [(int(k), float(v)) for k, v in params.logit_bias.items()]
    out.top_logprobs = -1 if params.logprobs is None else params.logprobs
    out.max_tokens = max_tokens
    out.min_tokens = params.min_tokens
    out.stop_token_ids = list(params.stop_token_ids)
    out.ignore_eos = params.ignore_eos
    out.constrained = params.constraint is not None
    return out


def _logprob(event) -> TokenLogprob:
    # The event's with_logprobs flag follows the trace's rendering (a first token prints plain);
    # the token itself was sampled on the host with its logprobs whenever the request asked.
    tok = event.token
    return TokenLogprob(tok.token, tok.logprob, [(int(i), float(lp)) for i, lp in tok.top])
