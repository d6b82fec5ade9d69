"""Read a GGUF file: its metadata into a ModelConfig (met.gguf_config), its tensors one at a time
into torch, kept as blocks or dequantized."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from met.gguf_config import field_value, read_config
from met.gguf_split import SplitGGUF, join_parts, parts_of
from met.kernels.cpu_quant import QTYPES, QuantLinear
from met.model.config import ModelConfig, ModelLoadError, check_weights
from met.model.families import FAMILIES
from met.model.fused import FUSED_QKV, split_expert_gate_up, split_fused
from met.model.linear import Weight

_FLOAT_TYPES = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
# Every quantized format met reads is one the C++ kernels read as stored.
SUPPORTED_TYPES = _FLOAT_TYPES | {GGMLQuantizationType[name] for name in QTYPES}
_GLOBAL_NAMES = {
    "token_embd.weight": "embed",
    "output.weight": "lm_head",
    "output_norm.weight": "norm",
}
_LAYER_NAMES = {
    "attn_norm.weight": "attn_norm",
    "attn_q.weight": "wq",
    "attn_k.weight": "wk",
    "attn_v.weight": "wv",
    "attn_q.bias": "bq",
    "attn_k.bias": "bk",
    "attn_v.bias": "bv",
    "attn_qkv.weight": FUSED_QKV,  # Phi-3: q, k, v rows in one matrix
    "attn_q_norm.weight": "q_norm",
    "attn_k_norm.weight": "k_norm",
    "attn_output.weight": "wo",
    "ffn_norm.weight": "mlp_norm",
    "post_attention_norm.weight": "post_attn_norm",  # Gemma 2/3
    "post_ffw_norm.weight": "post_mlp_norm",
    "ffn_gate.weight": "w_gate",
    "ffn_up.weight": "w_up",
    "ffn_down.weight": "w_down",
    "ffn_gate_inp.weight": "router",  # MoE (Qwen3-MoE, Mixtral): [E, H] router logits
}
# MoE experts stacked in one 3-D tensor [E, F, H] (ffn_down: [E, H, F]), one 2-D slice each.
_EXPERT_NAMES = {
    "ffn_gate_up_exps.weight": "w_gate_up",  # gate rows, then up rows (Gemma 4)
    "ffn_gate_exps.weight": "w_gate",
    "ffn_up_exps.weight": "w_up",
    "ffn_down_exps.weight": "w_down",
    "ffn_gate_exps.bias": "b_gate",  # gpt-oss: [E, F] (ffn_down_exps.bias: [E, H])
    "ffn_up_exps.bias": "b_up",
    "ffn_down_exps.bias": "b_down",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
# Early Mixtral GGUF files keep one 2-D tensor per expert: blk.N.ffn_gate.E.weight.
_LEGACY_EXPERT_RE = re.compile(r"ffn_(gate|up|down)\.(\d+)\.weight")
# Weights a matmul reads (the embedding too: tied, it is the lm_head), so keepable as blocks.
LINEAR_SUFFIXES = (
    ".wq",
    ".wk",
    ".wv",
    ".wo",
    ".w_gate",
    ".w_up",
    ".w_down",
    ".w_gate_up",  # Gemma 4's experts' gate and up as one stack (split into w_gate and w_up)
    ".ssm_qkv",  # a recurrent layer's projections (Qwen3.5 / Qwen3-Next)
    ".ssm_z",
    ".ssm_beta",
    ".ssm_alpha",
    ".ssm_ba",
    ".ssm_out",
    ".ple_gate",  # Gemma 4's per-layer embeddings
    ".ple_proj",
    "ple_model_proj",
    "embed",
    "lm_head",
    FUSED_QKV,
)


def open_gguf(path: str | Path) -> GGUFReader | SplitGGUF:
    """Open (memory-map) a GGUF file, or a split model's parts from its first, turning every way
    they can be unreadable into ModelLoadError."""
    path = Path(path)
    return join_parts(_open_file(path), path, _open_file)


def _open_file(path: Path) -> GGUFReader:
    if not path.is_file():
        raise ModelLoadError(
            f"{path}: no such model file; pass an existing .gguf file or run `met pull` "
            "to download the default model"
        )
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(
            f"{path}: not a GGUF file (magic {magic!r}); re-download it or point at a .gguf file"
        )
    try:
        return GGUFReader(path, "r")
    except Exception as exc:  # the reader raises bare ValueError/IndexError on truncation
        raise ModelLoadError(
            f"{path}: the GGUF file is corrupt or truncated ({exc}); "
            "delete it and download it again"
        ) from exc


def _dequantize(tensor: Any, path: Path) -> np.ndarray:
    if tensor.tensor_type not in SUPPORTED_TYPES:
        raise ModelLoadError(
            f"{path}: tensor {tensor.name} has type {tensor.tensor_type.name}, which met cannot "
            "dequantize; use a file quantized as F32/F16/BF16, Q8_0/Q5_0/Q5_1/Q4_0/Q4_1, "
            "Q2_K..Q6_K, IQ4_NL/IQ4_XS or MXFP4"
        )
    try:
        array = dequantize(tensor.data, tensor.tensor_type)
    except Exception as exc:
        raise ModelLoadError(
            f"{path}: tensor {tensor.name} is unreadable ({exc}); download the file again"
        ) from exc
    # F32 tensors come back as views of the read-only memory map; torch needs its own memory.
    return array if array.flags.writeable else array.copy()


def unpermute_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head interleaving of Q/K rows (rows [h, d//2, 2] -> [h, 2, d//2])."""
    rows = weight.shape[0]
    tail = weight.shape[1:]
    return (
        weight.reshape(n_heads, rows // n_heads // 2, 2, *tail)
        .transpose(1, 2)
        .reshape(rows, *tail)
        .contiguous()
    )


def _canonical_name(gguf_name: str, family_names: Mapping[str, str]) -> str | None:
    globals_ = {**_GLOBAL_NAMES, **family_names}
    if gguf_name in globals_:
        return globals_[gguf_name]
    match = _LAYER_RE.fullmatch(gguf_name)
    names = {**_LAYER_NAMES, **family_names}
    if match and match.group(2) in names:
        return f"layers.{match.group(1)}.{names[match.group(2)]}"
    if match and match.group(2) in _EXPERT_NAMES:
        return f"layers.{match.group(1)}.{_STACKED}.{_EXPERT_NAMES[match.group(2)]}"
    legacy = _LEGACY_EXPERT_RE.fullmatch(match.group(2)) if match else None
    if legacy:
        return f"layers.{match.group(1)}.experts.{legacy.group(2)}.w_{legacy.group(1)}"
    return None


_STACKED = "experts.*"  # in a canonical name: all experts' slices of one 3-D tensor


def _split_experts(name: str, weight: Weight, n_experts: int) -> Iterator[tuple[str, Weight]]:
    """Each expert's 2-D slice of a stacked [E, rows, cols] weight, as views (no copies)."""
    if isinstance(weight, QuantLinear):
        rows = weight.out_features // n_experts
        for e in range(n_experts):
            part = weight.blocks[e * rows : (e + 1) * rows]
            yield (
                name.replace("*", str(e)),
                QuantLinear(part, weight.qtype, rows, weight.in_features),
            )
        return
    bias = name.rsplit(".", 1)[-1].startswith("b_")
    stacked = (
        weight.reshape(n_experts, -1) if bias else weight.reshape(n_experts, -1, weight.shape[-1])
    )
    for e, part in enumerate(stacked):
        yield name.replace("*", str(e)), part


def iter_weights(
    reader: GGUFReader | SplitGGUF,
    config: ModelConfig,
    path: Path,
    dtype: torch.dtype,
    keep_blocks: bool = False,
) -> Iterator[tuple[str, Weight]]:
    """Yield (canonical name, CPU tensor in `dtype`), converting one tensor at a time.

    With keep_blocks, quantized linear weights come as QuantLinear over the tensor's own block
    bytes instead (every format of SUPPORTED_TYPES is one the kernels read as stored)."""
    for part, part_reader in parts_of(reader, Path(path)):
        with part.open("rb") as file:
            for tensor in part_reader.tensors:
                yield from _tensor_weights(tensor, config, part, dtype, keep_blocks, file)


def _tensor_weights(
    tensor: Any,
    config: ModelConfig,
    path: Path,
    dtype: torch.dtype,
    keep_blocks: bool,
    file: BinaryIO,
) -> Iterator[tuple[str, Weight]]:
    """The weights one GGUF tensor holds: none, itself, or each expert's slice of a stack."""
    layer = _LAYER_RE.fullmatch(tensor.name)
    if layer and int(layer.group(1)) >= config.n_layers:
        return  # a multi-token-prediction block after the decoder's (nextn_predict_layers)
    name = _canonical_name(tensor.name, FAMILIES[config.family].gguf_names)
    if name and not config.n_experts and (".experts." in name or name.endswith(".router")):
        name = None  # a router or experts in a file without expert_count
    if name is None and _LAYER_RE.fullmatch(tensor.name):
        # A layer tensor the forward would not apply: running without it is wrong.
        raise ModelLoadError(
            f"{path}: tensor {tensor.name} is not supported for architecture "
            f"{config.architecture!r}; met cannot run this model"
        )
    if name is None:
        return  # rope_freqs is read into the config; anything else is not ours to run
    weight = _weight(tensor, name, config, path, dtype, keep_blocks, file)
    if _STACKED not in name:
        yield name, weight
    elif len(tensor.shape) not in (2, 3) or int(tensor.shape[-1]) != config.n_experts:
        raise ModelLoadError(
            f"{path}: tensor {tensor.name} of shape {list(tensor.shape)} does not stack "
            f"{config.n_experts} experts (expert_count); the file is inconsistent"
        )
    else:
        yield from _split_experts(name, weight, config.n_experts)


def _weight(
    tensor: Any,
    name: str,
    config: ModelConfig,
    path: Path,
    dtype: torch.dtype,
    keep_blocks: bool,
    file: BinaryIO,
) -> Weight:
    blocks = keep_blocks and _blockwise(name, tensor)
    qtype = tensor.tensor_type.name
    # A quantized tensor's data is [rows, row bytes]: each row holds whole blocks along K,
    # so moving rows (the Q/K un-permutation) is exact on the bytes too.
    if blocks:
        raw = _read_bytes(file, tensor)  # [rows, row bytes]; [E, rows, row bytes] for experts
        weight = torch.from_numpy(raw.reshape(-1, raw.shape[-1]))
    else:
        weight = torch.from_numpy(_dequantize(tensor, path))
    permuted = FAMILIES[config.family].gguf_permuted
    if permuted and name.endswith((".wq", ".bq")):
        weight = unpermute_rows(weight, config.n_heads)
    elif permuted and name.endswith((".wk", ".bk")):
        weight = unpermute_rows(weight, config.n_kv_heads)
    if blocks:
        return QuantLinear(weight, qtype, weight.shape[0], int(tensor.shape[0]))
    return weight.to(dtype)


def _read_bytes(file: BinaryIO, tensor: Any) -> np.ndarray:
    """A tensor's bytes read into fresh memory, in the reader's [rows, row bytes] shape.

    Read, not copied out of the reader's memory map: the copy would leave the file's pages
    mapped and resident in this process (about the model's size again) until the reader goes."""
    out = np.empty(tensor.data.shape, dtype=np.uint8)
    file.seek(tensor.data_offset)
    if file.readinto(memoryview(out).cast("B")) != out.nbytes:
        raise ModelLoadError(f"{file.name}: {tensor.name} runs past the end of the file")
    return out


def _blockwise(name: str, tensor: Any) -> bool:
    # An unsupported format is not blockwise: _dequantize then names it in its error.
    quantized = tensor.tensor_type in SUPPORTED_TYPES - _FLOAT_TYPES
    return name.endswith(LINEAR_SUFFIXES) and quantized


def load_gguf(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    reader: GGUFReader | SplitGGUF | None = None,
    keep_blocks: bool = False,
    release_metadata: bool = False,
) -> tuple[ModelConfig, dict[str, Weight]]:
    """ModelConfig and canonical weights (CPU, `dtype`, or QuantLinear blocks with
    keep_blocks); Q/K rows in rotate-half order. With release_metadata the reader's metadata
    fields are cleared once the config is read (build the tokenizer first)."""
    path = Path(path)
    reader = reader or open_gguf(path)
    config = read_config(reader, path)
    # Phi-3's LongRoPE: the long factors when the model serves more than its original context
    # (as llama.cpp picks them), else the short ones.
    original = field_value(reader, f"{config.architecture}.rope.scaling.original_context_length")
    longrope = "rope_factors_long.weight"
    if original is None or config.context_length <= int(original):
        longrope = "rope_factors_short.weight"
    for tensor in reader.tensors:
        if tensor.name in ("rope_freqs.weight", longrope):
            config.rope_freq_factors = [float(x) for x in _dequantize(tensor, path).reshape(-1)]
    if release_metadata:
        # The vocabulary alone is ~250k small arrays (~90 MB here) that only the tokenizer and
        # the config read; dropping them before the weights arrive lowers the loading peak.
        reader.fields.clear()
    weights = dict(iter_weights(reader, config, path, dtype, keep_blocks))
    FAMILIES[config.family].load_weights(weights, config, "gguf")
    split_fused(weights, config, path)
    split_expert_gate_up(weights)
    check_weights(weights, config, path)
    return config, weights
