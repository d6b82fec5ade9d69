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


@pytest.mark.parametrize("family", ["qwen35", "qwen35moe", "qwen3next"])
def test_the_cpp_forward_reads_a_q8_0_hybrid_as_llama_cpp_does(tmp_path, family):
    """The hybrids' C++ CPU forward on Q8_0 blocks against llama.cpp on the same file. Both
    round activations to 8 bits per block, each with its own float sums around them, and these
    random models amplify that (their Q8_0 weights alone move the logits 15-40% from float32's):
    measured on a Zen 4, within 2.6% (Qwen3.5), 11% (-MoE) and 19% (Qwen3-Next) of the largest
    logit, met's torch forward as far, and every argmax llama.cpp's or within 1.3% of it."""
    import hybrid_fixtures

    path = hybrid_fixtures.write_gguf(
        hybrid_fixtures.build(family), tmp_path / "h.gguf", family, Q.Q8_0
    )
    runner = dict(paged_forwards(path))["cpp"]
    got = stepped_logits(runner, STEPS, dict.fromkeys(SEQS))
    for seq, ids in SEQS.items():
        want = _llama_cpp_logits(path, ids)
        mine = got[seq][: len(ids)]
        scale = want.abs().max().item()
        torch.testing.assert_close(mine, want, atol=0.25 * scale, rtol=0, msg=f"{family} {seq}")
        picked = want.gather(-1, mine.argmax(-1, keepdim=True))[:, 0]
        assert bool((want.max(-1).values - picked <= 2 * TOL * scale).all()), f"{family} {seq}"


def test_a_q4_k_m_file_runs_as_stored_and_answers_as_llama_cpp(tmp_path):
    """The default model re-quantized by llama.cpp's own quantizer to Q4_K_M (Q5_0, Q4_K, Q6_K
    and Q8_0 tensors, q/k/v of one layer in several formats): met keeps every block as stored
    (weights within 3% of the file), runs it on the C++ forward and answers greedily as
    llama.cpp does on the same file (measured: the first 26 tokens the same)."""
    import ctypes

    from model_fixtures import real_model_path

    import met
    from met.engine.capacity import weight_bytes
    from met.model.capability import cannot_run
    from met.models import load_model

    source = real_model_path()
    if source is None:
        pytest.skip("the default model file is not here")
    path = tmp_path / "q4_k_m.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, True
    assert (
        llama_cpp.llama_model_quantize(
            str(source).encode(), str(path).encode(), ctypes.byref(params)
        )
        == 0
    )
    _, model, _ = load_model(path, device="cpu", weight_format="auto")
    assert cannot_run(model, "cpu") is None
    assert weight_bytes(model) <= 1.03 * path.stat().st_size
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=2, verbose=False)
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
    want = []
    llm.eval(ids)
    for _ in range(8):
        want.append(int(llm.sample(temp=0.0)))
        llm.eval(want[-1:])
    greedy = met.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with met.LLM(model=str(path), device="cpu") as ours:
        assert ours.generate(prompt_token_ids=[ids], sampling_params=greedy)[0].token_ids == want
