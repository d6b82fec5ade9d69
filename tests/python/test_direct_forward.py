"""The scheduler runs decode and verify steps without a grammar row on the C++ CPU forward itself
(DirectForward; a plain sampled row is drawn there too, any other sampled row's logits go to the
Python sampler in place): every output, greedy, speculative, sampled, penalised, constrained or
with logprobs, is token for token the one the Python backend gives when every step goes through
it, and the direct steps do happen."""

from __future__ import annotations

import pytest

import met
from met.engine.torch_backend import TorchBackend
from met.sampling import Constraint, SamplingParams

pytestmark = pytest.mark.slow

REPEAT = "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox."


def _params() -> list[SamplingParams]:
    greedy = {"temperature": 0.0, "max_tokens": 24}
    # The first two outlast the rest; the grammar row takes every step it shares to Python.
    return [
        SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=7, max_tokens=24),
        SamplingParams(**greedy, min_tokens=6),  # the floor is sampled on the host
        SamplingParams(**greedy, logprobs=2),
        SamplingParams(**greedy, repetition_penalty=1.3),
        SamplingParams(**greedy, constraint=Constraint("regex", "[a-z ]{1,20}")),
    ]


def _generate(llm: met.LLM) -> list[tuple[list[int], str | None, list | None]]:
    prompts = ([REPEAT, "Say hello in French.", "List three colours."] * 3)[:7]
    ids = [llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    outs = llm.generate(prompt_token_ids=ids, sampling_params=_params())
    return [(o.token_ids, o.finish_reason, o.outputs[0].logprobs) for o in outs]


@pytest.fixture(scope="module")
def outputs(default_model_path) -> dict[str, tuple[list, met.LLM]]:
    path = str(default_model_path)
    out = {}
    for mode in ("direct", "python"):
        with pytest.MonkeyPatch.context() as patch:
            if mode == "python":
                patch.setattr(TorchBackend, "for_scheduler", lambda self: self)
            llm = met.LLM(model=path, speculative="ngram-forced")
            out[mode] = (_generate(llm), llm)
    return out


def test_every_output_is_the_python_backends(outputs) -> None:
    direct, python = outputs["direct"][0], outputs["python"][0]
    assert direct == python
    assert all(tokens for tokens, _, _ in direct)


def test_greedy_steps_ran_direct_and_the_rest_through_python(outputs) -> None:
    direct = outputs["direct"][1].engine
    assert direct.scheduler_backend is not direct.backend
    assert direct.scheduler.spec_stats().verify_steps > 0
    assert direct.scheduler_backend.direct_steps > 0
    assert direct.scheduler_backend.device_steps > 0
    python = outputs["python"][1].engine
    assert python.scheduler_backend is python.backend


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=32, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=3),
    ],
    ids=["greedy", "sampled", "logprobs"],
)
def test_a_request_alone_runs_every_step_after_its_prefill_direct(outputs, params) -> None:
    got = {}
    for mode, (_, llm) in outputs.items():
        backend = llm.engine.scheduler_backend
        ids = llm.tokenizer.encode_chat([{"role": "user", "content": REPEAT}])
        if mode == "direct":
            before = (backend.direct_steps, backend.device_steps)
        out = llm.generate(prompt_token_ids=[ids], sampling_params=params)[0]
        got[mode] = (out.token_ids, out.outputs[0].logprobs)
    assert got["direct"] == got["python"] and len(got["direct"][0]) == 32
    backend = outputs["direct"][1].engine.scheduler_backend
    assert backend.device_steps - before[1] == 1  # the prompt's one prefill
    assert backend.direct_steps - before[0] > 0


@pytest.mark.parametrize(
    ("params", "hosted"),
    [
        (SamplingParams(temperature=0.9, top_k=40, seed=3, max_tokens=16, ignore_eos=True), False),
        (SamplingParams(temperature=0.9, seed=3, max_tokens=16, ignore_eos=True, logprobs=0), True),
    ],
    ids=["plain", "logprobs"],
)
def test_only_rows_the_draw_cannot_take_reach_the_python_sampler(
    outputs, params, hosted, monkeypatch
) -> None:
    calls = []
    sample_logits = TorchBackend.sample_logits

    def counting(self, address, n_logits, vocab, rows):
        calls.append(len(rows))
        return sample_logits(self, address, n_logits, vocab, rows)

    monkeypatch.setattr(TorchBackend, "sample_logits", counting)
    llm = outputs["direct"][1]
    ids = llm.tokenizer.encode_chat([{"role": "user", "content": REPEAT}])
    out = llm.generate(prompt_token_ids=[ids], sampling_params=params)[0]
    assert len(out.token_ids) == 16
    assert bool(calls) == hosted
