"""Shared by the model tests: a tiny random Llama and a stand-in for the scheduler's paging."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import pre_tokenizers

from met.model.capability import cannot_run
from met.model.config import ModelConfig
from met.model.cpu_llama import CpuLlama
from met.model.kv_cache import PagedKvCache
from met.model.llama import LlamaModel
from met.models import load_model

HF_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "bq": "self_attn.q_proj.bias",
    "bk": "self_attn.k_proj.bias",
    "bv": "self_attn.v_proj.bias",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "wo": "self_attn.o_proj.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}


def tiny_config(**overrides: object) -> ModelConfig:
    values = dict(
        architecture="llama",
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        hidden=64,
        head_dim=16,
        ffn=128,
        vocab=128,
        rope_theta=10000.0,
        context_length=256,
        norm_eps=1e-5,
        bos_token_id=1,
        eos_token_ids=[2],
    )
    values.update(overrides)
    return ModelConfig(**values)


def random_weights(config: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def mat(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) / cols**0.5

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    c = config
    q_out, kv_out = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    w = {"embed": torch.randn(c.vocab, c.hidden, generator=gen), "norm": norm(c.hidden)}
    if not c.tie_embeddings:
        w["lm_head"] = mat(c.vocab, c.hidden)
    for i in range(c.n_layers):
        p = f"layers.{i}."
        w |= {
            p + "attn_norm": norm(c.hidden),
            p + "wq": mat(q_out, c.hidden),
            p + "wk": mat(kv_out, c.hidden),
            p + "wv": mat(kv_out, c.hidden),
            p + "wo": mat(c.hidden, q_out),
            p + "mlp_norm": norm(c.hidden),
            p + "w_gate": mat(c.ffn, c.hidden),
            p + "w_up": mat(c.ffn, c.hidden),
            p + "w_down": mat(c.hidden, c.ffn),
        }
        if c.qk_norm:
            w |= {p + "q_norm": norm(c.head_dim), p + "k_norm": norm(c.head_dim)}
        if c.attention_bias:
            w |= {
                p + "bq": 0.1 * torch.randn(q_out, generator=gen),
                p + "bk": 0.1 * torch.randn(kv_out, generator=gen),
                p + "bv": 0.1 * torch.randn(kv_out, generator=gen),
            }
    return w


def save_hf_folder(folder: Path, config: ModelConfig, weights: dict[str, torch.Tensor]) -> None:
    tensors = {}
    for name, tensor in weights.items():
        if name.startswith("layers."):
            _, i, short = name.split(".")
            tensors[f"model.layers.{i}.{HF_NAMES[short]}"] = tensor.contiguous()
    tensors["model.embed_tokens.weight"] = weights["embed"]
    tensors["model.norm.weight"] = weights["norm"]
    if "lm_head" in weights:
        tensors["lm_head.weight"] = weights["lm_head"]
    save_file(tensors, str(folder / "model.safetensors"))
    raw = {
        "model_type": config.architecture,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "hidden_size": config.hidden,
        "head_dim": config.head_dim,
        "intermediate_size": config.ffn,
        "vocab_size": config.vocab,
        "rope_theta": config.rope_theta,
        "max_position_embeddings": config.context_length,
        "rms_norm_eps": config.norm_eps,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_ids,
        "tie_word_embeddings": config.tie_embeddings,
    }
    (folder / "config.json").write_text(json.dumps(raw))


class PagedRunner:
    """Plays the scheduler: owns shuffled block tables and packs rows into one forward."""

    def __init__(
        self,
        model: LlamaModel,
        num_blocks: int = 64,
        block_size: int = 4,
        seed: int = 0,
        kv_dtype: torch.dtype | None = None,
    ):
        self.model = model
        self.cache: PagedKvCache = model.allocate_kv_cache(num_blocks, block_size, kv_dtype)
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)  # non-contiguous, out-of-order pages
        self.tables: dict[str, list[int]] = {}
        self.lens: dict[str, int] = {}
        self.state_slots: dict[str, int] = {}

    def reserve(self, rows: list[tuple[str, list[int]]]) -> list[int]:
        """Grow each row's table for its new tokens and advance its length; returns where each
        row's new tokens start."""
        starts = []
        for name, tokens in rows:
            start = self.lens.get(name, 0)
            table = self.tables.setdefault(name, [])
            while len(table) * self.cache.block_size < start + len(tokens):
                table.append(self.free.pop())
            self.lens[name] = start + len(tokens)
            starts.append(start)
        return starts

    def step(self, rows: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """Run rows (sequence name, new tokens) as one packed forward; logits of every token."""
        bs = self.cache.block_size
        ids, pos, slots, cu, seq_lens = [], [], [], [0], []
        for (name, tokens), start in zip(rows, self.reserve(rows), strict=True):
            table = self.tables[name]
            for offset, token in enumerate(tokens):
                p = start + offset
                ids.append(token)
                pos.append(p)
                slots.append(table[p // bs] * bs + p % bs)
            cu.append(len(ids))
            seq_lens.append(self.lens[name])
        width = max(len(self.tables[name]) for name, _ in rows) + 1
        tables = [self.tables[name] + [-1] * (width - len(self.tables[name])) for name, _ in rows]
        logits = self.model.forward(
            self.cache,
            torch.tensor(ids),
            torch.tensor(pos),
            torch.tensor(slots),
            torch.tensor(tables, dtype=torch.int32),
            torch.tensor(seq_lens, dtype=torch.int32),
            torch.tensor(cu, dtype=torch.int32),
            torch.arange(len(ids)),
            **self._state_slots(rows),
        )
        return [logits[cu[b] : cu[b + 1]] for b in range(len(rows))]

    def _state_slots(self, rows: list[tuple[str, list[int]]]) -> dict[str, torch.Tensor]:
        """A hybrid model's rows' recurrent-state slots: one per sequence, in order of arrival."""
        if not getattr(self.model, "recurrent_layers", None):
            return {}
        for name, _ in rows:
            self.state_slots.setdefault(name, len(self.state_slots))
        return {"state_slots": torch.tensor([self.state_slots[name] for name, _ in rows])}


def real_model_path() -> Path | None:
    """The default model file when present ($MET_TEST_MODEL first); the slow tests skip without."""
    import os

    from met.models import default_model_path

    override = os.environ.get("MET_TEST_MODEL")
    path = Path(override) if override else default_model_path()
    return path if path.is_file() else None


def byte_tokenizer_json(merges: Sequence[str] = ()) -> str:
    """A byte-level tokenizer with exactly 256 ids, so every id the random model picks decodes;
    each of `merges` ("y e") adds its result ("ye") as the next id."""
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "merges": list(merges)}
    model["vocab"] = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for merge in merges:
        model["vocab"]["".join(merge.split())] = len(model["vocab"])
    return json.dumps(
        {
            "version": "1.0",
            "added_tokens": [],
            "normalizer": None,
            "pre_tokenizer": level,
            "post_processor": None,
            "decoder": level,
            "model": model,
        }
    )


def paged_forwards(path, weight_format: str = "auto") -> list[tuple[str, PagedRunner]]:
    """(name, runner) for every forward the engine can run on the model file at `path` loaded
    in `weight_format`: torch, and the C++ CPU forward where it takes the model."""
    _, model, _ = load_model(path, device="cpu", weight_format=weight_format)
    runners = [("torch", PagedRunner(model, num_blocks=32, block_size=4, seed=1))]
    if cannot_run(model, "cpu") is None:
        cpp = PagedRunner(model, num_blocks=32, block_size=4, seed=1)
        cpp.model = CpuLlama(model, cpp.cache)
        runners.append(("cpp", cpp))
    return runners


def assert_forwards_match(path, steps, want: dict[str, torch.Tensor], tol: float) -> list[str]:
    """Run `steps` (lists of (sequence, new tokens) rows) through every forward of the file at
    `path` and assert each sequence's logits are within tol x its largest |logit| of `want`, with
    the same argmax everywhere; returns the forwards' names."""
    names = []
    for name, runner in paged_forwards(path):
        names.append(name)
        for seq, logits in stepped_logits(runner, steps, want).items():
            atol = tol * want[seq].abs().max().item()
            torch.testing.assert_close(logits, want[seq], atol=atol, rtol=0, msg=f"{name} {seq}")
            assert torch.equal(logits.argmax(-1), want[seq].argmax(-1)), f"{name} {seq}"
    return names


def stepped_logits(runner: PagedRunner, steps, seqs) -> dict[str, torch.Tensor]:
    """Each sequence's logits over `steps` (lists of (sequence, new tokens) rows), in order."""
    got: dict[str, list[torch.Tensor]] = {seq: [] for seq in seqs}
    for rows in steps:
        for (seq, _), logits in zip(rows, runner.step(rows), strict=True):
            got[seq].append(logits)
    return {seq: torch.cat(parts) for seq, parts in got.items()}


def exhaust_kv_once(backend, at: int) -> list:
    """Makes the backend's `at`-th decode plan raise KvExhausted, as a full KV pool does mid-decode
    (the scheduler preempts a sequence, prefilled again with its output later); returns the list
    of decode plans seen. Only plans that reach the Python backend count: a greedy decode on the
    C++ CPU forward skips it (DirectForward) unless TorchBackend.for_scheduler returns the backend
    itself."""
    from met import _core

    execute, calls = backend.execute, []

    def full_once(plan):
        if plan.call == _core.ReferenceCall.DecodeBatch:
            calls.append(plan)
            if len(calls) == at:
                raise _core.KvExhausted()
        return execute(plan)

    backend.execute = full_once
    return calls
