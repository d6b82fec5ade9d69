"""The 2026 families' GGUF files against llama.cpp itself (llama-cpp-python, the bench extra;
skipped where it is not installed): the tests' tiny random files of gpt-oss, Qwen3.5 / 3.5-MoE /
Qwen3-Next and Gemma 4, float32 weights, every position's logits of the two test prompts through
met's torch forward (chunked and batched as test_families steps them) and llama.cpp's own
(measured on an Intel Xeon: within 0.1% of the largest logit for gpt-oss, Qwen3-Next and
Gemma 4, 0.6% for Qwen3.5 and Qwen3.5-MoE; every argmax the same)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf_writing import Q
from hf_reference import SEQS, STEPS
from model_fixtures import paged_forwards, stepped_logits

llama_cpp = pytest.importorskip("llama_cpp")

TOL = 1e-2


def _gguf(family: str, folder):
    if family == "gpt-oss":
        from gpt_oss_fixtures import gpt_oss_gguf, gpt_oss_model

        return gpt_oss_gguf(gpt_oss_model(truncate=True), folder / "g.gguf")
    if family == "gemma4":
        from gemma4_fixtures import gemma4, write_gemma4_gguf

        return write_gemma4_gguf(gemma4(), folder / "g4.gguf", Q.F32)
    import hybrid_fixtures

    return hybrid_fixtures.write_gguf(hybrid_fixtures.build(family), folder / "h.gguf", family)


def _llama_cpp_logits(path, ids: list[int]) -> torch.Tensor:
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=256, logits_all=True, n_threads=2, verbose=False
    )
    llm.eval(ids)
    return torch.tensor(np.array(llm.scores[: len(ids)]))


@pytest.mark.parametrize("family", ["gpt-oss", "qwen35", "qwen35moe", "qwen3next", "gemma4"])
def test_met_reads_the_file_as_llama_cpp_does(tmp_path, family):
    path = _gguf(family, tmp_path)
    runner = dict(paged_forwards(path))["torch"]
    got = stepped_logits(runner, STEPS, dict.fromkeys(SEQS))
    for seq, ids in SEQS.items():
        want = _llama_cpp_logits(path, ids)
        mine = got[seq][: len(ids)]
        atol = TOL * want.abs().max().item()
        torch.testing.assert_close(mine, want, atol=atol, rtol=0, msg=f"{family} {seq}")
        assert torch.equal(mine.argmax(-1), want.argmax(-1)), f"{family} {seq}"
