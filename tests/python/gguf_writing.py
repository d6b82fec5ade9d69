"""What every test model's GGUF file is written with: its shape keys, a byte-level BPE vocabulary,
tensors in any format (random valid blocks for the K-quants and IQ4s gguf cannot quantize to),
and the final write; the tests' own writers (test_gguf, family_fixtures, gemma_fixtures) add the
rest."""

from __future__ import annotations

import math

import gguf
import numpy as np
import torch

Q = gguf.GGMLQuantizationType
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r"]


def bpe_vocab(specials: list[str] = SPECIALS) -> list[str]:
    """The special tokens, then the printable bytes (with byte-level space and newline), then
    the merges' results."""
    alphabet = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ"]
    return specials + alphabet + ["".join(m.split()) for m in MERGES]


def add_shape(w: gguf.GGUFWriter, layers: int, context: int, hidden: int, ffn: int) -> None:
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)


def add_attention(
    w: gguf.GGUFWriter, heads: int, kv_heads: int, theta: float, eps: float, head_dim: int = 0
) -> None:
    """Head counts, RoPE base and RMSNorm epsilon; key/value lengths only when given (llama.cpp
    derives them from the embedding length otherwise)."""
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    if head_dim:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(eps)


def add_bpe_tokenizer(
    w: gguf.GGUFWriter, pre: str, bos: int, eos: int, specials: list[str] = SPECIALS
) -> list[str]:
    """bpe_vocab(specials) as a gpt2-model tokenizer with `pre` pre-tokenization; returns it."""
    tokens = bpe_vocab(specials)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    return tokens


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to Q/K rows for its interleaved RoPE."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


# The formats gguf cannot quantize to, written as random valid blocks.
RANDOM_ONLY = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS)


def random_blocks(rows: int, cols: int, qtype: Q, seed: int = 0) -> np.ndarray:
    """Valid blocks of a format gguf cannot quantize to (RANDOM_ONLY): random quants and
    scales, with every float16 scale field set to a small positive value."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, cols // block_elems, block_bytes), dtype=np.uint8)
    # Where each format keeps its float16 d (and dmin): first for Q4_K/Q5_K (both) and the IQ4s,
    # last for Q3_K/Q6_K (Q2_K: both).
    fields = {
        Q.Q2_K: (block_bytes - 4, block_bytes - 2),
        Q.Q3_K: (block_bytes - 2,),
        Q.Q4_K: (0, 2),
        Q.Q5_K: (0, 2),
        Q.Q6_K: (block_bytes - 2,),
        Q.IQ4_NL: (0,),
        Q.IQ4_XS: (0,),
    }[qtype]
    for offset in fields:
        scale = rng.uniform(1e-3, 1e-2, raw.shape[:2]).astype(np.float16)
        raw[..., offset : offset + 2] = scale[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


def store(writer: gguf.GGUFWriter, name: str, w: torch.Tensor, qtype: Q) -> None:
    """`w` as tensor `name` in `qtype` (K-quants: random valid blocks of the same shape)."""
    array = w.numpy().astype(np.float32)
    if qtype == Q.F32:
        writer.add_tensor(name, array)
    elif qtype == Q.F16:
        writer.add_tensor(name, array.astype(np.float16))
    elif qtype in RANDOM_ONLY:
        blocks = random_blocks(math.prod(array.shape[:-1]), array.shape[-1], qtype, len(name))
        writer.add_tensor(name, blocks.reshape(*array.shape[:-1], -1), raw_dtype=qtype)
    else:
        writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)


def finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
