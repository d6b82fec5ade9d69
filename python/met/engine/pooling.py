"""Embeddings and rerank scores: prompts run through the model's forward with no tokens generated
and no KV kept, their final hidden states pooled (or, for a reranker, the last position's
yes/no logits scored).

A model's pooling comes from its file (GGUF `{arch}.pooling_type`, as llama.cpp's converter
writes it for embedding models; a sentence-transformers folder's `1_Pooling/config.json`) or from
--pooling. Prompts run in the engine thread between scheduler steps, all inputs of the requests
waiting at that moment as one packed forward (split where the KV pool's free blocks or
--max-batch-tokens run out), in blocks taken from the block manager under ids of their own and
released before the next step: the scheduler never sees them, and no block outlives the call.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from met.engine.forward_rows import Row, pack_rows

POOLINGS = ("none", "mean", "cls", "last", "rank")  # llama.cpp's pooling_type values, in order
# Sequence ids of pooled prompts in the block manager: far above the scheduler's request ids.
_FIRST_ID = 1 << 60


def file_pooling(path: Path) -> str | None:
    """The pooling a model file asks for; None for a generative model (or one that says none)."""
    if path.is_file():
        from met.gguf_loader import field_value, open_gguf

        reader = open_gguf(path)
        arch = field_value(reader, "general.architecture")
        kind = field_value(reader, f"{arch}.pooling_type")
        if isinstance(kind, int) and 0 < kind < len(POOLINGS):
            return POOLINGS[kind]
        return None
    settings = path / "1_Pooling" / "config.json"
    if not settings.is_file():
        return None
    modes = json.loads(settings.read_text())
    for key, kind in (
        ("pooling_mode_lasttoken", "last"),
        ("pooling_mode_mean_tokens", "mean"),
        ("pooling_mode_cls_token", "cls"),
    ):
        if modes.get(key):
            return kind
    return None


def pooler_for(config: Any, path: Path, model: Any, cache: Any, blocks: Any) -> Pooler | None:
    """The engine's pooler: --pooling, else what the model file says; None when neither pools."""
    pooling = config.pooling or file_pooling(path)
    if pooling is None or pooling == "none":
        return None
    if pooling not in POOLINGS:
        raise ValueError(f"pooling: {', '.join(POOLINGS)}; not {pooling!r}")
    if config.tensor_parallel_size > 1:
        raise ValueError("embeddings and rerank run on one rank: no --tensor-parallel-size")
    return Pooler(model, cache, blocks, pooling, config.max_batch_tokens)


class Pooler:
    """Runs prompts through `model` over `cache`, with blocks of `blocks`."""

    def __init__(self, model: Any, cache: Any, blocks: Any, pooling: str, max_tokens: int) -> None:
        self.model, self.cache, self.blocks = model, cache, blocks
        self.pooling = pooling
        self.max_tokens = max_tokens  # packed tokens per forward
        self._next_id = _FIRST_ID

    def embed(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        """Each prompt's pooled, L2-normalized final hidden state (float32 [hidden])."""
        return [F.normalize(v, dim=-1) for v in self._run(prompts, self._pooled)]

    def score(self, prompts: list[list[int]], yes: int, no: int) -> list[float]:
        """Each prompt's P(yes) over {yes, no} at its last position (a Qwen3-Reranker-style
        causal reranker)."""
        outs = self._run(prompts, self._last)
        return [_yes_probability(self.model.head(h[None])[0], yes, no) for h in outs]

    def _pooled(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.pooling == "mean":
            return hidden.mean(dim=0)
        return hidden[0] if self.pooling == "cls" else hidden[-1]

    @staticmethod
    def _last(hidden: torch.Tensor) -> torch.Tensor:
        return hidden[-1]

    def _run(self, prompts: list[list[int]], reduce) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        batch: list[list[int]] = []
        for prompt in prompts:
            if batch and not self._fits(batch + [prompt]):
                out += self._forward(batch, reduce)
                batch = []
            if not self._fits([prompt]):
                raise ValueError(
                    f"input: {len(prompt)} tokens do not fit the KV cache's free blocks now"
                )
            batch.append(prompt)
        if batch:
            out += self._forward(batch, reduce)
        return out

    def _fits(self, batch: list[list[int]]) -> bool:
        size = self.blocks.block_size()
        needed = sum(math.ceil(len(p) / size) for p in batch)
        tokens = sum(len(p) for p in batch)
        return needed <= self.blocks.num_free_blocks() and (
            tokens <= self.max_tokens or len(batch) == 1
        )

    def _forward(self, batch: list[list[int]], reduce) -> list[torch.Tensor]:
        ids = [self._take_id() for _ in batch]
        try:
            tables = []
            for seq_id, prompt in zip(ids, batch, strict=True):
                self.blocks.allocate_prefix(seq_id, [])
                if not self.blocks.grow(seq_id, len(prompt)):
                    raise ValueError("input: the KV cache ran out of free blocks")
                tables.append(self.blocks.table(seq_id))
            rows = [Row(None, prompt, 0) for prompt in batch]
            inputs = pack_rows(rows, tables, self.blocks.block_size(), self.model.device)
            cu = inputs["cu_seqlens"].tolist()
            inputs["logits_rows"] = torch.arange(cu[-1], device=self.model.device)
            hidden = self.model.forward(self.cache, **inputs, hidden=True)
            return [reduce(hidden[cu[i] : cu[i + 1]]) for i in range(len(batch))]
        finally:
            for seq_id in ids:
                if self.blocks.has(seq_id):
                    self.blocks.release(seq_id)

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id


def _yes_probability(logits: torch.Tensor, yes: int, no: int) -> float:
    pair = torch.stack([logits[yes], logits[no]]).double()
    return float(torch.softmax(pair, dim=0)[0])


def truncate(vector: torch.Tensor, dimensions: int | None) -> list[float]:
    """An embedding cut to its first `dimensions` (Matryoshka), normalized again."""
    if dimensions is not None and dimensions < vector.numel():
        vector = F.normalize(vector[:dimensions], dim=-1)
    return vector.tolist()
