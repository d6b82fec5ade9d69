"""CudaLlama (the GPU forward) on the CPU, its kernels swapped for the torch versions in
torch_kernel_ops: packing, validation, the decode graphs' padded buffers and the engine wiring.
The kernels and real graph capture run in test_cuda_kernels.py / test_engine_gpu.py on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch_kernel_ops
from model_fixtures import (
    PagedRunner,
    byte_tokenizer_json,
    random_weights,
    save_hf_folder,
    tiny_config,
)

import met
from met.engine import core
from met.model import cuda_llama
from met.model.capability import cannot_run
from met.model.cuda_llama import CudaLlama, graph_batch_sizes
from met.model.llama import LlamaModel
from met.sampling import SamplingParams

# Both sides compute in float32 with the same math; they differ in summation order only.
TOL = 1e-5

STEPS = [
    [("a", list(range(3, 14)))],
    [("a", [20]), ("b", [5, 6, 7, 8, 9, 10, 11])],
    [("b", [30]), ("a", [21]), ("c", [1, 2])],
    [("a", [22]), ("b", [31]), ("c", [3, 4, 5, 6, 7, 8, 9, 10, 11])],
    [("a", [23]), ("b", [32]), ("c", [12])],  # decode only: 3 rows in the graph of 4
    [("c", [13]), ("a", [24])],
]


def tiny_model(**overrides) -> LlamaModel:
    config = tiny_config(**overrides)
    return LlamaModel(config, random_weights(config, seed=5))


def paired(model: LlamaModel, graphs: str = "eager") -> tuple[PagedRunner, PagedRunner]:
    """Runners over separate pools with the same block ids: torch's forward, then CudaLlama's."""
    ref, ours = PagedRunner(model), PagedRunner(model)
    ours.model = CudaLlama(model, ours.cache, 256, 4, ops=torch_kernel_ops, graphs=graphs)
    return ref, ours


@pytest.mark.parametrize("graphs", ["eager", "off"])
@pytest.mark.parametrize(
    "overrides",
    [{}, {"n_kv_heads": 4}, {"architecture": "qwen2", "attention_bias": True}],
)
def test_matches_the_torch_forward(graphs: str, overrides: dict) -> None:
    ref, ours = paired(tiny_model(**overrides), graphs)
    for rows in STEPS:
        for want, got in zip(ref.step(rows), ours.step(rows), strict=True):
            torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)
    torch.testing.assert_close(ours.cache.k, ref.cache.k, rtol=TOL, atol=TOL)
    torch.testing.assert_close(ours.cache.v, ref.cache.v, rtol=TOL, atol=TOL)


def test_padding_rows_of_a_graph_batch_write_no_kv() -> None:
    model = tiny_model()
    runner = PagedRunner(model)
    forward = CudaLlama(model, runner.cache, 256, 8, ops=torch_kernel_ops, graphs="eager")
    runner.model = forward
    runner.step([("a", [1, 2, 3]), ("b", [4, 5])])
    before = runner.cache.k.clone(), runner.cache.v.clone()
    runner.step([("a", [6]), ("b", [7]), ("c", [8])])  # runs in the graph buffers of 4 rows
    written = set()
    for name in ("a", "b", "c"):
        p = runner.lens[name] - 1
        written.add(runner.tables[name][p // 4] * 4 + p % 4)
    for after, old in zip((runner.cache.k, runner.cache.v), before, strict=True):
        layers = after.shape[0]
        by_slot = (after != old).view(layers, -1, after[0, 0, 0].numel()).any(-1).any(0)
        assert set(by_slot.nonzero().flatten().tolist()) == written


def test_forward_rows_returns_last_token_logits_and_argmax() -> None:
    model = tiny_model()
    ref, ours = paired(model)
    rows = [("a", list(range(10, 19))), ("b", [3, 4])]
    want = [logits[-1] for logits in ref.step(rows)]
    starts = ours.reserve(rows)
    tables = [ours.tables[name] for name, _ in rows]
    logits, greedy = ours.model.forward_rows([t for _, t in rows], starts, tables)
    torch.testing.assert_close(logits, torch.stack(want), rtol=TOL, atol=TOL)
    assert greedy.tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize(
    ("tokens", "starts", "table", "message"),
    [
        ([[999]], [0], [0], "vocabulary"),
        ([[1, 2]], [0], [64], "KV pool"),
        ([[1, 2, 3, 4, 5]], [0], [0], "block table covers"),
        ([[1]], [300], [0] * 76, "RoPE"),
        ([[]], [0], [0], "at least one"),
    ],
)
def test_bad_rows_raise_before_the_pool_is_touched(tokens, starts, table, message) -> None:
    model = tiny_model()
    runner = PagedRunner(model)
    forward = CudaLlama(model, runner.cache, 256, 4, ops=torch_kernel_ops, graphs="eager")
    before = runner.cache.k.clone()
    with pytest.raises(ValueError, match=message):
        forward.forward_rows(tokens, starts, [table])
    assert torch.equal(runner.cache.k, before)


def test_graph_batch_sizes_end_at_the_engine_batch() -> None:
    assert graph_batch_sizes(8) == [1, 2, 4, 8]
    assert graph_batch_sizes(12) == [1, 2, 4, 8, 12]
    assert graph_batch_sizes(1) == [1]


@pytest.fixture
def tiny_folder(tmp_path):
    config = tiny_config(vocab=256)
    save_hf_folder(tmp_path, config, random_weights(config, seed=9))
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json())
    return tmp_path


def _with_kernels(model, cache, max_model_len, config) -> CudaLlama:
    return CudaLlama(
        model, cache, max_model_len, config.max_num_seqs, ops=torch_kernel_ops, graphs="eager"
    )


def _engine(folder) -> met.LLM:
    # Short chunks: chunked prefill, mixed steps and batched decode all run.
    return met.LLM(str(folder), "float32", device="cpu", max_prefill_tokens=8)


def test_the_engine_backend_runs_it_and_greedy_tokens_match(tiny_folder, monkeypatch) -> None:
    prompts = [[10 + i + j for j in range(5 + 3 * i)] for i in range(5)]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)

    def tokens() -> tuple[list[list[int]], object]:
        with _engine(tiny_folder) as llm:
            outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
            chosen = llm.engine.backend.model
        return [out.token_ids for out in outs], chosen

    want, plain = tokens()
    assert isinstance(plain, LlamaModel)
    monkeypatch.setattr(core, "_fast_forward", _with_kernels)
    got, chosen = tokens()
    assert isinstance(chosen, CudaLlama) and chosen.graph_batch_sizes == [1, 2, 4, 8]
    assert got == want


def test_plain_rows_are_drawn_by_the_sampling_kernel(tiny_folder, monkeypatch) -> None:
    monkeypatch.setattr(core, "_fast_forward", _with_kernels)
    drawn: list[int] = []
    kernel_sample = CudaLlama.kernel_sample

    def counting(self, logits, rows, params):
        drawn.append(len(rows))
        return kernel_sample(self, logits, rows, params)

    monkeypatch.setattr(CudaLlama, "kernel_sample", counting)
    seeded = SamplingParams(
        temperature=0.9, top_k=50, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True
    )
    prompt = list(range(40, 52))
    others = [
        SamplingParams(temperature=0.7, repetition_penalty=1.3, seed=1, max_tokens=12),
        SamplingParams(temperature=0.7, logprobs=2, seed=2, max_tokens=12),
    ]
    with _engine(tiny_folder) as llm:
        alone = llm.generate(prompt_token_ids=[prompt], sampling_params=seeded)[0]
        assert sum(drawn) == 12  # every pick of the plain row came from the kernel
        batch = llm.generate(
            prompt_token_ids=[prompt, list(range(60, 70)), list(range(80, 95))],
            sampling_params=[seeded, *others],
        )
    assert batch[0].token_ids == alone.token_ids
    assert len(set(alone.token_ids)) > 1  # drawn, not stuck on one token
    logprobs = batch[2].outputs[0].logprobs
    assert logprobs and all(lp.logprob <= 0.0 for lp in logprobs)  # the torch sampler's


def test_a_cpu_model_keeps_its_own_forward() -> None:
    model = tiny_model()
    cache = model.allocate_kv_cache(8, 4)
    assert cannot_run(model, "cuda") == "met's kernels run on a CUDA device"
    assert cuda_llama.cuda_forward_for(model, cache, 256, 8) is model


# Relative to the largest logit: float32 differs in summation order only; bfloat16 rounds every
# activation (2^-8) on both sides in different places.
GPU_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_llama.cuda_ops.available(), reason="needs a GPU and a CUDA build")
@pytest.mark.parametrize("dtype", list(GPU_TOL))
def test_on_a_gpu_the_kernels_and_graphs_match_the_torch_forward(dtype) -> None:
    config = tiny_config()
    model = LlamaModel(config, random_weights(config, seed=5), dtype=dtype, device="cuda")
    assert cannot_run(model, "cuda") is None
    ref, ours = PagedRunner(model), PagedRunner(model)
    ours.model = CudaLlama(model, ours.cache, 256, 4)
    assert ours.model.graph_batch_sizes == [1, 2, 4]
    for rows in STEPS:
        for want, got in zip(ref.step(rows), ours.step(rows), strict=True):
            assert not torch.isnan(got).any()
            err = float((got - want).abs().max() / want.abs().max())
            assert err < GPU_TOL[dtype], (rows, err)
