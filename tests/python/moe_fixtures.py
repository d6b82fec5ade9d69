"""The mixture-of-experts parts of family_fixtures' tiny models (Qwen3-MoE, Mixtral): random
routers and experts, their GGUF layout (stacked 3-D expert tensors, as llama.cpp's converter
writes them) and their Hugging Face layout (one tensor per expert)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import torch
from safetensors.torch import load_file, save_file

from met.model.config import ModelConfig

# Mistral's instruction format: [INST] around user turns, assistant turns closed by EOS.
MIXTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
MOE_SHAPE = {"n_experts": 4, "n_experts_used": 2, "ffn": 32}
_PARTS = ("w_gate", "w_up", "w_down")
# Stacked GGUF tensors per canonical part; the HF names of one expert's part, per family.
_GGUF_EXPERTS = {"w_gate": "ffn_gate_exps", "w_up": "ffn_up_exps", "w_down": "ffn_down_exps"}
_HF = {
    "qwen3_moe": ("mlp.gate", {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}),
    "mixtral": ("block_sparse_moe.gate", {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}),
}


def add_experts(config: ModelConfig, weights: dict, seed: int) -> None:
    """Replace each layer's dense MLP in `weights` by a router and E random experts. The router
    is scaled up so that top-k picks are clear-cut: the Q8_0 forwards move router logits a
    little, and a near-tie between the k-th and the next expert would flip a pick."""
    gen = torch.Generator().manual_seed(seed + 1)
    h, f = config.hidden, config.ffn
    for i in range(config.n_layers):
        p = f"layers.{i}."
        for part in _PARTS:
            del weights[p + part]
        weights[p + "router"] = 4 * torch.randn(config.n_experts, h, generator=gen) / h**0.5
        for e in range(config.n_experts):
            q = f"{p}experts.{e}."
            weights[q + "w_gate"] = torch.randn(f, h, generator=gen) / h**0.5
            weights[q + "w_up"] = torch.randn(f, h, generator=gen) / h**0.5
            weights[q + "w_down"] = torch.randn(h, f, generator=gen) / f**0.5


def gguf_experts(weights: dict, config: ModelConfig, legacy: bool) -> dict[str, torch.Tensor]:
    """The expert weights as GGUF tensors by their names there: per layer the router and the
    three stacked [E, rows, cols] tensors (legacy: early Mixtral files' one 2-D tensor per
    expert, blk.N.ffn_gate.E.weight); pops them from `weights`."""
    out = {}
    for i in range(config.n_layers):
        p = f"layers.{i}."
        out[f"blk.{i}.ffn_gate_inp.weight"] = weights.pop(p + "router")
        for part, name in _GGUF_EXPERTS.items():
            names = [f"{p}experts.{e}.{part}" for e in range(config.n_experts)]
            if legacy:
                for e, n in enumerate(names):
                    out[f"blk.{i}.{name.removesuffix('_exps')}.{e}.weight"] = weights.pop(n)
            else:
                out[f"blk.{i}.{name}.weight"] = torch.stack([weights.pop(n) for n in names])
    return out


def add_gguf_metadata(writer: gguf.GGUFWriter, config: ModelConfig, arch: str) -> None:
    writer.add_expert_count(config.n_experts)
    writer.add_expert_used_count(config.n_experts_used)
    if arch == "qwen3moe":  # Mixtral's experts are feed_forward_length wide
        writer.add_expert_feed_forward_length(config.ffn)


def hf_experts(folder: Path, config: ModelConfig, weights: dict) -> None:
    """Add the experts to the folder's safetensors and config.json as the family names them."""
    router, parts = _HF[config.architecture]
    prefix = "mlp" if config.architecture == "qwen3_moe" else "block_sparse_moe"
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    for i in range(config.n_layers):
        p = f"model.layers.{i}."
        tensors[f"{p}{router}.weight"] = weights[f"layers.{i}.router"]
        for e in range(config.n_experts):
            for part, name in parts.items():
                tensor = weights[f"layers.{i}.experts.{e}.{part}"]
                tensors[f"{p}{prefix}.experts.{e}.{name}.weight"] = tensor.contiguous()
    save_file(tensors, str(path))
    raw = json.loads((folder / "config.json").read_text())
    raw["num_experts_per_tok"] = config.n_experts_used
    if config.architecture == "mixtral":
        raw["num_local_experts"] = config.n_experts
    else:
        raw |= {
            "num_experts": config.n_experts,
            "moe_intermediate_size": config.ffn,
            "intermediate_size": 4 * config.ffn,  # the dense layers' width (none here)
            "norm_topk_prob": config.moe_norm_topk,
        }
    (folder / "config.json").write_text(json.dumps(raw))


def dense_only(weights: dict) -> dict:
    """The weights save_hf_folder knows how to name (everything but routers and experts)."""
    return {n: t for n, t in weights.items() if ".experts." not in n and ".router" not in n}
