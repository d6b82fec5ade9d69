"""Host sampler: determinism, truncation, penalties, stop masking and logprobs."""

from __future__ import annotations

import torch

from met import _core
from met.model.sampler import RowParams, SampleSpec, argmax, draw_params, sample

V = 50


def _logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 2


def _row(**params: object) -> SampleSpec:
    extra = {
        k: params.pop(k)
        for k in ("history", "prompt_len", "n_generated", "mask_stop", "stop_tokens")
        if k in params
    }
    return SampleSpec(RowParams(**params), **extra)


def _tokens(logits: torch.Tensor, rows: list[SampleSpec]) -> list[int]:
    return [s.token for s in sample(logits, rows)]


def test_temperature_zero_is_argmax():
    logits = _logits(4)
    assert _tokens(logits, [_row() for _ in range(4)]) == argmax(logits).tolist()


def test_top_k_one_is_greedy():
    logits = _logits(3, seed=1)
    rows = [_row(temperature=1.5, top_k=1, seed=s) for s in range(3)]
    assert _tokens(logits, rows) == argmax(logits).tolist()


def test_seeded_sampling_is_reproducible_and_stateless():
    logits = _logits(1, seed=2).repeat(3, 1)
    rows = [_row(temperature=1.0, seed=7, n_generated=n) for n in (0, 1, 0)]
    first = _tokens(logits, rows)
    assert first == _tokens(logits, rows)
    assert first[0] == first[2]  # same (seed, step) -> same token regardless of batch position
    picks = {_tokens(logits[:1], [_row(temperature=1.0, seed=s)])[0] for s in range(40)}
    assert len(picks) > 3  # different seeds really draw differently


def test_draws_follow_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1] + [0.0] * (V - 3)]))
    counts = torch.zeros(V)
    for s in range(400):
        counts[_tokens(logits, [_row(temperature=1.0, seed=s)])[0]] += 1
    assert counts[3:].sum() == 0
    assert abs(counts[0] / 400 - 0.7) < 0.08 and abs(counts[2] / 400 - 0.1) < 0.06


def test_top_k_top_p_min_p_truncate():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05] + [0.0] * (V - 4)])
    logits = torch.log(probs)
    for params, allowed in [
        ({"top_k": 2}, {0, 1}),
        ({"top_p": 0.7}, {0, 1}),  # 0.5 < 0.7, 0.8 >= 0.7: the second token closes the nucleus
        ({"top_p": 0.81}, {0, 1, 2}),
        ({"min_p": 0.35}, {0, 1}),  # 0.15 < 0.35 * 0.5
        ({"top_k": 3, "top_p": 0.6}, {0, 1}),
    ]:
        seen = {_tokens(logits, [_row(temperature=1.0, seed=s, **params)])[0] for s in range(200)}
        assert seen == allowed, params


def test_logit_bias_and_stop_mask():
    logits = torch.zeros(1, V)
    assert _tokens(logits, [_row(logit_bias=[(17, 5.0)])]) == [17]
    assert _tokens(logits, [_row(logit_bias={9: 5.0})]) == [9]
    masked = _row(logit_bias=[(17, 5.0), (3, 4.0)], mask_stop=True, stop_tokens=[17])
    assert _tokens(logits, [masked]) == [3]  # min_tokens floor: the stop token cannot be drawn
    unmasked = _row(logit_bias=[(17, 5.0)], mask_stop=False, stop_tokens=[17])
    assert _tokens(logits, [unmasked]) == [17]


def test_penalties():
    logits = torch.zeros(1, V)
    logits[0, 4], logits[0, 5], logits[0, 6] = 3.0, 2.9, -1.0
    # Presence/frequency count output tokens only: 4 in the prompt is not penalised.
    assert _tokens(logits, [_row(presence_penalty=1.0, history=[4, 4], n_generated=0)]) == [4]
    assert _tokens(logits, [_row(presence_penalty=1.0, history=[1, 4], n_generated=1)]) == [5]
    freq = _row(frequency_penalty=0.2, history=[4, 4, 5], n_generated=3)
    assert _tokens(logits, [freq]) == [5]  # 3 - 2 * 0.2 < 2.9 - 0.2
    presence = _row(presence_penalty=0.2, history=[9, 4, 4, 5], prompt_len=1)
    assert _tokens(logits, [presence]) == [4]  # once per token: 3 - 0.2 > 2.9 - 0.2
    # Repetition penalty covers prompt and output, dividing positive and multiplying negative.
    rep = sample(logits, [_row(repetition_penalty=2.0, history=[4, 6], top_logprobs=0)])[0]
    assert rep.token == 5
    adjusted = logits.clone()
    adjusted[0, 4], adjusted[0, 6] = 1.5, -2.0
    assert abs(rep.logprob - torch.log_softmax(adjusted, -1)[0, 5].item()) < 1e-5


def test_top_logprobs_sorted_and_consistent():
    logits = _logits(2, seed=3)
    rows = [_row(temperature=0.7, seed=1, top_logprobs=5), _row(top_logprobs=0)]
    out = sample(logits, rows)
    reference = torch.log_softmax(logits, dim=-1)
    ids, values = zip(*out[0].top, strict=True)
    assert list(values) == sorted(values, reverse=True) and len(ids) == 5
    assert list(ids) == reference[0].topk(5).indices.tolist()
    assert torch.allclose(torch.tensor(values), reference[0, list(ids)], atol=1e-6)
    assert abs(out[0].logprob - reference[0, out[0].token].item()) < 1e-6
    # Temperature does not change the reported distribution.
    assert out[1].top == [] and abs(out[1].logprob - reference[1].max().item()) < 1e-6


def test_input_logits_untouched():
    logits = _logits(1)
    before = logits.clone()
    sample(logits, [_row(logit_bias=[(1, 3.0)], repetition_penalty=1.5, history=[2])])
    assert torch.equal(logits, before)


def test_draws_are_the_gpu_kernels_reference_draws():
    # A plain row's token is the one the GPU kernel's reference (kernel_refs.sample) draws.
    logits = _logits(24, seed=4)
    settings = [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_k": 5},
        {"temperature": 1.2, "top_p": 0.8},
        {"temperature": 0.9, "top_k": 20, "top_p": 0.6, "min_p": 0.05},
    ]
    rows = [_row(seed=100 + i, n_generated=i, **settings[i % 4]) for i in range(24)]
    params = draw_params([r.params for r in rows], [r.n_generated for r in rows])
    expected = _core.kernel_refs.sample(logits.numpy(), **params).tolist()
    assert _tokens(logits, rows) == expected
    assert len(set(expected)) > 5
