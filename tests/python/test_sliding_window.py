"""Sliding-window attention (Mistral 7B v0.1, every layer sliding): each query reads only the
last `window` keys, through prefill chunks, batches and decode, with the prefix cache on; the
context is not capped. Both the torch forward and the C++ one (over a GGUF file's blocks)."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import (
    PagedRunner,
    byte_tokenizer_json,
    random_weights,
    save_hf_folder,
    tiny_config,
)
from test_gguf import write_tiny_gguf

import met
from met.gguf_loader import load_gguf
from met.model.cpu_llama import CpuLlama
from met.model.llama import LlamaModel
from met.model.reference import reference_logits
from met.models import load_model

WINDOW = 5
SEQS = {"a": list(range(3, 20)), "b": list(range(40, 52))}
STEPS = [
    [("a", SEQS["a"][:7])],
    [("a", SEQS["a"][7:9]), ("b", SEQS["b"][:6])],
    [("b", SEQS["b"][6:]), ("a", SEQS["a"][9:])],
]


@pytest.mark.parametrize("forward", ["torch", "cpp"])
def test_the_paged_forward_reads_only_the_window(tmp_path, forward):
    seqs = {name: list(seq) for name, seq in SEQS.items()}
    if forward == "torch":
        config = tiny_config(architecture="mistral", sliding_window=WINDOW)
        weights = random_weights(config, seed=2)
        runner = PagedRunner(LlamaModel(config, dict(weights)), num_blocks=32, block_size=4)
        full = reference_logits(tiny_config(architecture="mistral"), weights, seqs["a"])
        want = reference_logits(config, weights, seqs["a"])
        assert not torch.allclose(full[WINDOW:], want[WINDOW:], atol=1e-3)  # it matters
        torch.testing.assert_close(full[:WINDOW], want[:WINDOW])  # and only past the window
    else:  # Q8_0 blocks; the reference runs the file's dequantized weights
        path = tmp_path / "window.gguf"
        write_tiny_gguf(path, sliding_window=WINDOW)
        config, weights = load_gguf(path)
        assert config.sliding_window == WINDOW
        _, model, _ = load_model(path, device="cpu", weight_format="gguf")
        runner = PagedRunner(model, num_blocks=32, block_size=4)
        runner.model = CpuLlama(model, runner.cache)
    got: dict[str, list[torch.Tensor]] = {n: [] for n in seqs}
    for rows in STEPS:
        for (seq, _), logits in zip(rows, runner.step(rows), strict=True):
            got[seq].append(logits)
    # Then decode steps, one token per row, past the window.
    for token in (60, 61, 62):
        rows = [("a", [token]), ("b", [token])]
        for (seq, _), logits in zip(rows, runner.step(rows), strict=True):
            got[seq].append(logits)
            seqs[seq] = [*seqs[seq], token]
    for name, parts in got.items():
        want = reference_logits(config, weights, seqs[name])
        # Q8_0's int8 activations move logits by up to ~1% of the largest (test_families).
        atol = 2e-4 if forward == "torch" else 1.5e-2 * want.abs().max().item()
        torch.testing.assert_close(torch.cat(parts), want, atol=atol, rtol=0)
        assert torch.equal(torch.cat(parts).argmax(-1), want.argmax(-1))


def _hf_folder(folder):
    config = tiny_config(architecture="mistral", vocab=256, sliding_window=8)
    weights = random_weights(config, seed=4)
    save_hf_folder(folder, config, weights)
    raw = (
        (folder / "config.json")
        .read_text()
        .replace('"rms_norm_eps"', '"sliding_window": 8, "rms_norm_eps"')
    )
    (folder / "config.json").write_text(raw)
    (folder / "tokenizer.json").write_text(byte_tokenizer_json())
    return folder, config, weights


@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_the_engine_serves_past_the_window_with_the_prefix_cache(tmp_path, source):
    if source == "hf":  # the torch forward
        path, config, weights = _hf_folder(tmp_path)
    else:  # the C++ forward over Q8_0 blocks
        path = tmp_path / "window.gguf"
        write_tiny_gguf(path, sliding_window=8)
        config, weights = load_gguf(path)
    llm = met.LLM(model=str(path), device="cpu", max_prefill_tokens=6, block_size=4)
    try:
        assert llm.engine.max_model_len == 256  # not capped at the window
        assert isinstance(llm.engine.backend.model, CpuLlama) == (source == "gguf")
        greedy = met.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        prompts = [list(range(10, 30)), list(range(50, 63)), list(range(10, 30))]
        alone = [llm.generate(prompt_token_ids=[p], sampling_params=greedy)[0] for p in prompts]
        assert alone[2].usage["cached_tokens"] > 0  # the third prompt is the first again
        assert alone[2].token_ids == alone[0].token_ids
        batch = llm.generate(prompt_token_ids=prompts, sampling_params=greedy)
        assert [o.token_ids for o in batch] == [o.token_ids for o in alone]
        # The reference continues the prompt greedily with the same window.
        tokens = list(prompts[0])
        for _ in range(8):
            tokens.append(int(reference_logits(config, weights, tokens)[-1].argmax()))
        assert alone[0].token_ids == tokens[len(prompts[0]) :]
    finally:
        llm.close()
