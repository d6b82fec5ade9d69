"""A hybrid model (Qwen3.5-MoE's recurrent + gated attention layers) through the engine: each
sequence's recurrent state zeroed at admission in its state slot (the scheduler's StatePool),
carried across prefill chunks, kept there while its batch row is compacted, every slot free again
after finish, abort and preemption; speculation exact (spec on =
off), greedy tokens batch-invariant and transformers' own (prefix caching: test_qwen3_hybrid_
prefix.py)."""

from __future__ import annotations

import pytest
import torch
from gguf_writing import Q
from hybrid_fixtures import build, write_gguf

import met
from met import _core
from met.kernels.cpu_quant import QuantLinear

GREEDY = met.SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
# The first prompt is longer than two prefill chunks (max_prefill_tokens=16).
PROMPTS = [[(5 * i) % 90 + 10 for i in range(40)], [30, 31, 32], [50, 51, 52, 53, 54, 55, 56]]
OPTIONS = {"device": "cpu", "max_num_seqs": 4, "max_prefill_tokens": 16}


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    model = build("qwen35moe")
    return model, write_gguf(model, tmp_path_factory.mktemp("hybrid") / "m.gguf", "qwen35moe")


def _tokens(llm: met.LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY)]


def _all_slots_free(llm: met.LLM) -> bool:
    """Every batch row and every recurrent-state slot (the scheduler's StatePool) is free."""
    states = llm.engine.states
    states.check_invariants()
    n = OPTIONS["max_num_seqs"]
    return sorted(llm.engine.backend._free_slots) == list(range(n)) and states.num_free() == n


def test_greedy_tokens_are_transformers_and_batch_invariant(hybrid):
    model, path = hybrid
    with met.LLM(model=str(path), **OPTIONS) as llm:
        alone = [_tokens(llm, [p])[0] for p in PROMPTS]
        assert _tokens(llm, PROMPTS) == alone
        assert _all_slots_free(llm)
    for prompt, out in zip(PROMPTS, alone, strict=True):
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1]
        picked = logits[torch.arange(len(out)), torch.tensor(out)]
        # transformers' argmax, up to near-ties (met's logits are within 2e-5 of its largest).
        assert bool((logits.max(-1).values - picked <= 1e-4 * logits.abs().max()).all())


def test_a_state_stays_with_its_sequence_when_the_batch_rows_are_compacted(hybrid, monkeypatch):
    # The first request ends early: the rows after it move down, their states do not.
    params = [
        met.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (2, 12, 12)
    ]
    with met.LLM(model=str(hybrid[1]), **OPTIONS) as llm:
        alone = [_tokens(llm, [p])[0] for p in PROMPTS]
        backend, moves = llm.engine.backend, []
        compact = backend.compact_sequence

        def counted(seq, new_slot):
            moves.append(new_slot != seq.slot)
            return compact(seq, new_slot)

        monkeypatch.setattr(backend, "compact_sequence", counted)
        outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
        assert any(moves) and _all_slots_free(llm)
    together = [o.token_ids for o in outputs]
    assert together[0] == alone[0][:2]
    assert [t[:10] for t in together[1:]] == alone[1:]


def test_quantized_greedy_tokens_are_batch_invariant(tmp_path):
    """A Q8_0 file keeps its blocks: the torch forward's quantized matmuls, alone = batched."""
    path = write_gguf(build("qwen35moe"), tmp_path / "q8.gguf", "qwen35moe", Q.Q8_0)
    with met.LLM(model=str(path), **OPTIONS) as llm:
        assert isinstance(llm.engine.model.layers[0]["deltanet"].w_in, QuantLinear)
        alone = [_tokens(llm, [p])[0] for p in PROMPTS]
        assert _tokens(llm, PROMPTS) == alone


def test_the_pools_hold_kv_of_attention_layers_and_state_of_recurrent_ones(hybrid):
    _, path = hybrid
    with met.LLM(model=str(path), **OPTIONS) as llm:
        cache, config = llm.engine.backend.kv_cache, llm.engine.model_config
        assert cache.k.shape[0] == 1 and cache.where == [
            None,
            None,
            None,
            (0, 0),
        ]  # layer 3 attends
        shape = config.recurrent
        assert cache.state.conv.shape == (3, 4, shape.conv_dim, shape.kernel - 1)
        assert cache.state.delta.shape == (3, 4, shape.v_heads, shape.k_dim, shape.v_dim)
        per_seq = 3 * (shape.conv_dim * 3 + shape.v_heads * shape.k_dim * shape.v_dim) * 4
        assert llm.engine.capacity.state_bytes == per_seq
        assert (
            f"recurrent state {per_seq / 1024:.1f} KiB a sequence" in llm.engine.capacity.describe()
        )
        one_layer = 2 * config.n_kv_heads * config.head_dim * 4  # float32 K and V of one layer
        assert llm.engine.capacity.kv_token_bytes == one_layer


@pytest.mark.slow  # 600 greedy tokens twice: acceptances start after about a hundred
def test_speculation_is_exact(tmp_path):
    """Drafts verified and mostly rejected: each rejection puts back the recurrent state after
    the last accepted token (without that the tokens differ), and the output is the plain one."""
    path = write_gguf(build("qwen35moe"), tmp_path / "q8.gguf", "qwen35moe", Q.Q8_0)
    # Prompts this model continues with recurring n-grams of its own, which the proposer drafts.
    prompts = [[30, 31, 32], [50, 51, 52, 53], [7, 7, 7, 7], [60, 61, 60, 61, 60, 61]]
    params = met.SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True)
    outputs = {}
    for mode in ("off", "ngram-forced"):
        with met.LLM(model=str(path), device="cpu", max_num_seqs=4, speculative=mode) as llm:
            done = llm.generate(prompt_token_ids=prompts, sampling_params=params)
            outputs[mode] = [o.token_ids for o in done]
            spec = llm.engine.stats().speculation
    assert spec.drafted > spec.accepted > 0 and spec.verify_steps > 0
    assert outputs["ngram-forced"] == outputs["off"]


def test_preemption_and_abort_free_every_state_slot(hybrid, monkeypatch):
    _, path = hybrid
    with met.LLM(model=str(path), **OPTIONS) as llm:
        want = _tokens(llm, PROMPTS)
        backend = llm.engine.backend
        execute, calls, admitted = backend.execute, [], []
        alloc = backend.alloc_sequence

        def counted(seq, budget):
            admitted.append(seq.session_hash)
            return alloc(seq, budget)

        def exhausted_once(plan):
            # The third decode step finds the pool full: the scheduler preempts (recompute).
            if plan.call == _core.ReferenceCall.DecodeBatch:
                calls.append(len(plan.rows))
                if len(calls) == 3:
                    raise _core.KvExhausted("KV cache exhausted")
            return execute(plan)

        monkeypatch.setattr(backend, "execute", exhausted_once)
        monkeypatch.setattr(backend, "alloc_sequence", counted)
        assert _tokens(llm, PROMPTS) == want
        # A preempted sequence was admitted again (a fresh state, its prompt and output
        # prefilled anew) and gave the same tokens.
        assert len(admitted) > len(PROMPTS) and _all_slots_free(llm)
        monkeypatch.undo()
        llm.engine.add_request("gone", PROMPTS[0], GREEDY)
        llm.engine.add_request("kept", PROMPTS[1], GREEDY)
        llm.engine.step()
        llm.engine.abort("gone")
        while llm.engine.has_work():
            llm.engine.step()
        assert _all_slots_free(llm)
        assert _tokens(llm, PROMPTS[1:2]) == want[1:2]
