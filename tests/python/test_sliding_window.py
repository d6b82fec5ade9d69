"""Sliding-window attention (Mistral 7B v0.1): each query reads only the last `window` keys,
through prefill chunks, batches and decode, with the prefix cache on; the context is not capped.
The torch forward windows; the C++ forward is kept for contexts up to the window."""

from __future__ import annotations

import torch
from model_fixtures import (
    PagedRunner,
    byte_tokenizer_json,
    random_weights,
    save_hf_folder,
    tiny_config,
)

import met
from met.model.cpu_llama import unsupported_reason
from met.model.llama import LlamaModel
from met.model.reference import reference_logits

WINDOW = 5
SEQS = {"a": list(range(3, 20)), "b": list(range(40, 52))}
STEPS = [
    [("a", SEQS["a"][:7])],
    [("a", SEQS["a"][7:9]), ("b", SEQS["b"][:6])],
    [("b", SEQS["b"][6:]), ("a", SEQS["a"][9:])],
]


def test_the_paged_forward_reads_only_the_window():
    config = tiny_config(architecture="mistral", sliding_window=WINDOW)
    weights = random_weights(config, seed=2)
    want = {name: reference_logits(config, weights, seq) for name, seq in SEQS.items()}
    full = reference_logits(tiny_config(architecture="mistral"), weights, SEQS["a"])
    assert not torch.allclose(full[WINDOW:], want["a"][WINDOW:], atol=1e-3)  # it matters
    torch.testing.assert_close(full[:WINDOW], want["a"][:WINDOW])  # and only past the window
    runner = PagedRunner(LlamaModel(config, dict(weights)), num_blocks=32, block_size=4)
    got: dict[str, list[torch.Tensor]] = {n: [] for n in SEQS}
    for rows in STEPS:
        for (seq, _), logits in zip(rows, runner.step(rows), strict=True):
            got[seq].append(logits)
    # Then decode steps, one token per row, past the window.
    for token in (60, 61, 62):
        rows = [("a", [token]), ("b", [token])]
        for (seq, _), logits in zip(rows, runner.step(rows), strict=True):
            got[seq].append(logits)
            SEQS[seq] = [*SEQS[seq], token]
    for name, parts in got.items():
        want = reference_logits(config, weights, SEQS[name])
        torch.testing.assert_close(torch.cat(parts), want, atol=2e-4, rtol=0)


def test_the_engine_serves_past_the_window_with_the_prefix_cache(tmp_path):
    config = tiny_config(architecture="mistral", vocab=256, sliding_window=8)
    weights = random_weights(config, seed=4)
    save_hf_folder(tmp_path, config, weights)
    raw = (
        (tmp_path / "config.json")
        .read_text()
        .replace('"rms_norm_eps"', '"sliding_window": 8, "rms_norm_eps"')
    )
    (tmp_path / "config.json").write_text(raw)
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json())
    llm = met.LLM(model=str(tmp_path), device="cpu", max_prefill_tokens=6, block_size=4)
    try:
        assert llm.engine.max_model_len == 256  # not capped at the window
        assert unsupported_reason(llm.engine.model, llm.engine.max_model_len) is not None
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
