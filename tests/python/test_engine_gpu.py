"""The engine on a GPU: the scheduler's streams and event are real CUDA objects there."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import (
    byte_tokenizer_json,
    random_weights,
    real_model_path,
    save_hf_folder,
    tiny_config,
)

import met
from met import _core
from met.model.cuda_llama import CudaLlama
from met.sampling import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
    pytest.mark.skipif(not _core.has_cuda(), reason="met._core was built without CUDA"),
]


def test_gpu_greedy_matches_cpu() -> None:
    # The GPU check machine has no network: the default model is used only where it is present.
    default_model_path = real_model_path()
    if default_model_path is None:
        pytest.skip("the default model file is not here")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    gpu = met.LLM(model=str(default_model_path), dtype="float32", device="cuda")
    assert gpu.engine.backend.streams is not None
    assert isinstance(gpu.engine.backend.model, CudaLlama)
    cpu = met.LLM(model=str(default_model_path), dtype="float32", device="cpu")
    assert gpu.chat(messages, params)[0].text == cpu.chat(messages, params)[0].text


def test_tiny_model_same_tokens_with_graphs_eager_and_on_the_cpu(tmp_path) -> None:
    """Chunked prefill on the prefill stream, mixed steps and graph-replayed decode batches; the
    last two requests are sampled (by the kernel, and by the torch sampler for logprobs)."""
    config = tiny_config(vocab=256)
    save_hf_folder(tmp_path, config, random_weights(config, seed=9))
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json())
    prompts = [[10 + i + j for j in range(5 + 3 * i)] for i in range(6)]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    drawn = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=12, ignore_eos=True)
    with_logprobs = SamplingParams(temperature=0.8, seed=4, logprobs=2, max_tokens=12)
    params = [greedy] * 4 + [drawn, with_logprobs]

    def tokens(**options) -> list[list[int]]:
        with met.LLM(str(tmp_path), "float32", max_prefill_tokens=8, **options) as llm:
            forward = llm.engine.backend.model
            if options["device"] == "cuda":
                assert isinstance(forward, CudaLlama)
                eager = options.get("enforce_eager", False)
                assert forward.graph_batch_sizes == ([] if eager else [1, 2, 4, 8, 16, 32, 64])
            outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
        return [out.token_ids for out in outs]

    graphed = tokens(device="cuda")
    assert graphed == tokens(device="cuda", enforce_eager=True)
    assert graphed[:4] == tokens(device="cpu")[:4]  # the CPU draws with another generator
