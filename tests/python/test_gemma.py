"""Gemma 2 and Gemma 3 from a tiny random GGUF (Q8_0 and F32) and an HF folder: the paged
forwards (C++ over GGUF blocks, torch over the same or dense weights), prompts chunked and
batched and decoded past the sliding window, against gemma_reference (written from the Hugging
Face modeling code and checked against transformers' Gemma2/Gemma3ForCausalLM to 4e-6); greedy
tokens alone and in a batch, with the prefix cache; the Gemma chat template; `met serve`."""

from __future__ import annotations

import httpx
import pytest
import torch
from gemma_fixtures import (
    CONFIGS,
    TEMPLATE,
    WINDOW,
    Q,
    dequantized_hf_weights,
    gemma_config,
    gemma_weights,
    write_gemma_gguf,
    write_gemma_hf,
)
from gemma_reference import gemma_logits
from model_fixtures import PagedRunner, assert_forwards_match
from server_harness import start_server

import met
from met.model.cpu_llama import CpuLlama
from met.models import load_model

# Tolerances on logits, as a share of the largest |logit|. Float weights agree with the
# reference up to float32 summation order; a Q8_0 file is checked against the reference over
# its own dequantized weights, where the quantized matmul's int8 activations move logits by up
# to ~1% (measured), and every argmax must still agree.
TOL = {"f32": 2e-5, "hf": 2e-5, "q8_0": 2e-2}
SEQS = {"a": list(range(5, 19)), "b": [40, 41, 42, 43, 44, 45, 46, 47, 48]}
# a's prompt in three chunks, b's in two, sharing steps; then three decode steps of both.
STEPS = [
    [("a", SEQS["a"][:5])],
    [("a", SEQS["a"][5:11]), ("b", SEQS["b"][:4])],
    [("b", SEQS["b"][4:]), ("a", SEQS["a"][11:])],
    *[[("a", [t]), ("b", [t + 1])] for t in (60, 61, 62)],
]
FAMILIES = sorted(CONFIGS)


def _source(tmp_path, family: str, kind: str):
    if kind == "hf":
        # The folder's own query_pre_attn_scalar (a GGUF file has no such key).
        config, weights = write_gemma_hf(tmp_path / family, family, query_pre_attn_scalar=24)
        return tmp_path / family, config, weights
    path = tmp_path / f"{family}-{kind}.gguf"
    config, weights = write_gemma_gguf(path, family, Q.F32 if kind == "f32" else Q.Q8_0)
    if kind == "q8_0":
        weights = dequantized_hf_weights(path, config)
    return path, config, weights


def _whole(steps, seq: str) -> list[int]:
    return [t for rows in steps for name, tokens in rows if name == seq for t in tokens]


@pytest.mark.parametrize("kind", ["q8_0", "f32", "hf"])
@pytest.mark.parametrize("family", FAMILIES)
def test_paged_forwards_match_the_reference(tmp_path, family, kind):
    path, config, weights = _source(tmp_path, family, kind)
    want = {seq: gemma_logits(config, weights, _whole(STEPS, seq)) for seq in SEQS}
    names = assert_forwards_match(path, STEPS, want, TOL[kind])
    assert names == (["torch", "cpp"] if kind == "q8_0" else ["torch"])


@pytest.mark.parametrize("family", FAMILIES)
def test_the_fixture_exercises_what_gemma_adds(family):
    """Each feature the forwards are checked on changes these models' logits."""
    config = gemma_config(family)
    weights = gemma_weights(config)
    tokens = list(range(5, 25))  # past the window
    want = gemma_logits(config, weights, tokens)
    changes = {"sliding_window": 10_000, "query_pre_attn_scalar": 24}
    if family == "gemma2":
        changes |= {"attn_logit_softcapping": None, "final_logit_softcapping": None}
    else:
        changes |= {"rope_local_base_freq": 1e6, "rope_scaling": None}
    for key, value in changes.items():
        other = gemma_logits({**config, key: value}, weights, tokens)
        assert not torch.allclose(other, want, atol=1e-2), key


@pytest.mark.parametrize("weight_format", ["gguf", "dequantized"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_alone_batched_and_cached_past_the_window(tmp_path, family, weight_format):
    path = tmp_path / f"{family}.gguf"
    write_gemma_gguf(path, family)
    llm = met.LLM(
        model=str(path),
        device="cpu",
        weight_format=weight_format,
        max_prefill_tokens=5,
        block_size=4,
    )
    try:
        assert llm.engine.max_model_len == 256  # not capped at the window
        cpp = isinstance(llm.engine.backend.model, CpuLlama)
        assert cpp == (weight_format == "gguf")
        greedy = met.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        shared = list(range(10, 10 + 3 * WINDOW))  # a prefix three windows long
        prompts = [shared + [70, 71], [30, 31, 32], shared + [80]]
        alone = [llm.generate(prompt_token_ids=[p], sampling_params=greedy)[0] for p in prompts]
        assert alone[2].usage["cached_tokens"] >= 2 * WINDOW  # the prefix came from the cache
        batch = llm.generate(prompt_token_ids=prompts, sampling_params=greedy)
        assert [o.token_ids for o in alone] == [o.token_ids for o in batch]
        config = gemma_config(family)
        weights = dequantized_hf_weights(path, config)
        for prompt, out in zip(prompts, alone, strict=True):
            tokens = list(prompt)
            for _ in range(6):
                tokens.append(int(gemma_logits(config, weights, tokens)[-1].argmax()))
            assert out.token_ids == tokens[len(prompt) :]
    finally:
        llm.close()


def test_the_gemma_chat_template(tmp_path):
    path = tmp_path / "gemma3.gguf"
    write_gemma_gguf(path, "gemma3")
    llm = met.LLM(model=str(path), device="cpu")
    try:
        tok = llm.tokenizer
        assert tok.chat_template == TEMPLATE
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi "},
            {"role": "user", "content": "world"},
        ]
        text = tok.apply_chat_template(messages)
        assert text == (
            "<bos><start_of_turn>user\nBe brief.\n\nhello<end_of_turn>\n<start_of_turn>model\n"
            "hi<end_of_turn>\n<start_of_turn>user\nworld<end_of_turn>\n<start_of_turn>model\n"
        )
        ids = tok.encode_chat(messages)
        assert ids[0] == 2 and tok.decode(ids, skip_special=False) == text
        # The turn markers are the vocabulary's control tokens, only where the template put them.
        assert ids.count(tok.special_id("<start_of_turn>")) == 4
        assert tok.special_id("<end_of_turn>") in tok.eos_token_ids
        with pytest.raises(ValueError, match="alternate"):
            tok.apply_chat_template([{"role": "assistant", "content": "first"}])
        out = llm.chat(messages, met.SamplingParams(temperature=0.0, max_tokens=4))[0]
        assert out.usage["prompt_tokens"] == len(ids)
    finally:
        llm.close()


def test_met_serve_answers_chat_on_gemma3(tmp_path):
    path = tmp_path / "gemma3.gguf"
    write_gemma_gguf(path, "gemma3")
    server = start_server("--model", str(path), "--served-model-name", "gemma3")
    try:
        client = server.openai()
        ask = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
        reply = client.chat.completions.create(
            model="gemma3", messages=ask, max_tokens=4, temperature=0
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
        # BOS, the turn markers and "model\n" around "Be brief.\n\nhello": the template's count.
        assert reply.usage.prompt_tokens > 10
        bad = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "gemma3", "messages": [{"role": "assistant", "content": "x"}]},
            timeout=30,
        )
        assert bad.status_code == 400 and "alternate" in bad.text
        assert client.models.list().data[0].id == "gemma3"  # still serving
    finally:
        assert server.stop() == 0


def test_the_27b_query_scale_on_the_cpp_forward(tmp_path):
    """llama.cpp scales a 46-layer Gemma 2's queries by 1/sqrt(hidden / heads), not by
    1/sqrt(head_dim) (its 27B; the file has no key for it): met reads the file the same way."""
    path = tmp_path / "gemma2-27b-shape.gguf"
    shape = {"num_hidden_layers": 46, "head_dim": 32, "query_pre_attn_scalar": 16}
    config, _ = write_gemma_gguf(path, "gemma2", **shape)
    weights = dequantized_hf_weights(path, config)
    _, model, _ = load_model(path, device="cpu", weight_format="gguf")
    assert model.config.query_scale == 16**-0.5
    runner = PagedRunner(model, num_blocks=16, block_size=4)
    runner.model = CpuLlama(model, runner.cache)
    tokens = list(range(5, 19))
    got = torch.cat(runner.step([("a", tokens[:9])]) + runner.step([("a", tokens[9:])]))
    want = gemma_logits(config, weights, tokens)
    # 46 layers of int8 activations: 4.4% of the largest logit measured (the torch forward over
    # the F32 file: 1e-6); the default scale would be 40% off.
    atol = 0.1 * want.abs().max().item()
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
    default = gemma_logits({**config, "query_pre_attn_scalar": 32}, weights, tokens)
    assert not torch.allclose(default, want, atol=2 * atol)  # the scale matters here
