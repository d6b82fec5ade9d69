"""The engine on a GPU: the scheduler's streams and event are real CUDA objects there."""

from __future__ import annotations

import pytest
import torch

import met
from met import _core
from met.sampling import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
    pytest.mark.skipif(not _core.has_cuda(), reason="met._core was built without CUDA"),
]


def test_gpu_greedy_matches_cpu(default_model_path) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    gpu = met.LLM(model=str(default_model_path), dtype="float32", device="cuda")
    assert gpu.engine.backend.streams is not None
    cpu = met.LLM(model=str(default_model_path), dtype="float32", device="cpu")
    assert gpu.chat(messages, params)[0].text == cpu.chat(messages, params)[0].text
