"""GGUF loading on tiny files written here the way llama.cpp's converter writes them."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from model_fixtures import random_weights, tiny_config

from met.gguf_loader import load_gguf
from met.kernels.cpu_quant import QuantLinear
from met.model.config import ModelLoadError
from met.models import load_model
from met.tokenizer import Tokenizer, byte_level_bytes

Q = gguf.GGMLQuantizationType
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GGUF_NAMES = {
    "attn_norm": "attn_norm.weight",
    "wq": "attn_q.weight",
    "wk": "attn_k.weight",
    "wv": "attn_v.weight",
    "wo": "attn_output.weight",
    "mlp_norm": "ffn_norm.weight",
    "w_gate": "ffn_gate.weight",
    "w_up": "ffn_up.weight",
    "w_down": "ffn_down.weight",
}


def _vocab() -> list[str]:
    alphabet = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ"]  # byte-level space and newline
    return SPECIALS + alphabet + ["".join(m.split()) for m in MERGES]


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to Q/K rows for its interleaved RoPE."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _store(writer: gguf.GGUFWriter, name: str, w: torch.Tensor, qtype: Q) -> None:
    array = w.numpy().astype(np.float32)
    if qtype == Q.F32:
        writer.add_tensor(name, array)
    elif qtype == Q.F16:
        writer.add_tensor(name, array.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)


def write_tiny_gguf(path: Path, qtype: Q = Q.Q8_0, tied: bool = True) -> tuple:
    tokens = _vocab()
    config = tiny_config(vocab=len(tokens), tie_embeddings=tied)
    weights = random_weights(config, seed=3)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(config.n_layers)
    w.add_context_length(config.context_length)
    w.add_embedding_length(config.hidden)
    w.add_feed_forward_length(config.ffn)
    w.add_head_count(config.n_heads)
    w.add_head_count_kv(config.n_kv_heads)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    _store(w, "token_embd.weight", weights["embed"], qtype)
    if not tied:
        _store(w, "output.weight", weights["lm_head"], qtype)
    _store(w, "output_norm.weight", weights["norm"], Q.F32)
    for i in range(config.n_layers):
        for short, name in GGUF_NAMES.items():
            tensor = weights[f"layers.{i}.{short}"]
            if short in ("wq", "wk"):
                heads = config.n_heads if short == "wq" else config.n_kv_heads
                tensor = torch.from_numpy(_permute(tensor.numpy(), heads))
            _store(w, f"blk.{i}.{name}", tensor, Q.F32 if short.endswith("norm") else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return config, weights


@pytest.mark.parametrize(("qtype", "atol"), [(Q.F32, 0.0), (Q.F16, 2e-3), (Q.Q8_0, 2e-2)])
def test_loads_and_unpermutes(tmp_path, qtype, atol):
    path = tmp_path / "tiny.gguf"
    source_config, source = write_tiny_gguf(path, qtype, tied=qtype != Q.F16)
    config, weights = load_gguf(path)
    assert (config.n_layers, config.n_heads, config.n_kv_heads) == (2, 4, 2)
    assert (config.head_dim, config.vocab, config.eos_token_ids) == (16, source_config.vocab, [2])
    assert config.tie_embeddings == source_config.tie_embeddings
    assert config.chat_template == TEMPLATE
    assert weights.keys() == source.keys()
    for name, tensor in source.items():
        assert weights[name].shape == tensor.shape, name
        assert (weights[name] - tensor).abs().max().item() <= atol * tensor.abs().max().item(), name


def test_bf16_request(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, Q.F32)
    _, weights = load_gguf(path, torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in weights.values())


def test_tokenizer_from_gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    tok = Tokenizer.from_gguf(path)
    vocab = _vocab()
    ids = tok.encode("hello world")
    assert [vocab[i] for i in ids] == ["hello", "Ġw", "or", "l", "d"]
    assert tok.decode(ids) == "hello world"
    assert tok.eos_token_ids == [2] and tok.vocab_size == len(vocab)
    assert tok.encode("<|im_end|>") != [2]
    chat = tok.encode_chat([{"role": "user", "content": "hello<|im_end|>"}])
    tail = tok.encode("assistant\n")
    assert chat.count(2) == 1 and chat[0] == 1 and chat[-len(tail) :] == tail
    assert tok.decode(chat, skip_special=False) == tok.apply_chat_template(
        [{"role": "user", "content": "hello<|im_end|>"}]
    )
    assert byte_level_bytes(["Ġ"], set()) == [b" "]


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="nothere.gguf"):
        load_gguf(tmp_path / "nothere.gguf")


def test_corrupt_and_truncated_files(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(ModelLoadError, match=r"bad\.gguf.*not a GGUF file"):
        load_gguf(bad)
    path = tmp_path / "cut.gguf"
    write_tiny_gguf(path)
    data = path.read_bytes()
    for keep in (len(data) // 2, 200, 10):
        path.write_bytes(data[:keep])
        with pytest.raises(ModelLoadError, match=r"cut\.gguf"):
            load_gguf(path)


def write_spm_gguf(path: Path) -> list[str]:
    """A SentencePiece-style ("llama") vocabulary: scores rank merges, <0xXX> byte fallback."""
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "▁he", "▁hell", "▁hello", "▁w"]
    tokens = ["<unk>", "<s>", "</s>", *pieces, "<0xC3>", "<0xA9>"]
    types = [2, 3, 3] + [1] * len(pieces) + [6, 6]
    scores = [0.0, 0.0, 0.0] + [-float(i) for i in range(len(pieces))] + [0.0, 0.0]
    config = tiny_config(vocab=len(tokens))
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(config.n_layers)
    w.add_embedding_length(config.hidden)
    w.add_feed_forward_length(config.ffn)
    w.add_head_count(config.n_heads)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens


def test_sentencepiece_vocab(tmp_path):
    path = tmp_path / "spm.gguf"
    tokens = write_spm_gguf(path)
    tok = Tokenizer.from_gguf(path)
    ids = tok.encode("hello world")
    assert [tokens[i] for i in ids] == ["▁hello", "▁w", "o", "r", "l", "d"]
    assert tok.encode("hello", add_special=True)[0] == 1  # this vocab asks for BOS
    assert tok.decode(tok.encode("hé")) == " hé"  # é through <0xC3><0xA9> byte fallback
    assert tok.decode([1, *ids]) == " hello world"


@pytest.mark.parametrize(("qtype", "tied"), [(Q.Q8_0, True), (Q.Q4_1, False)])
def test_weight_formats_hold_the_same_weights(tmp_path, qtype, tied):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, qtype, tied=tied)
    # auto: a GGUF file on the CPU keeps its blocks, unless a dtype is asked for.
    _, quant, _ = load_model(path, device="cpu", weight_format="auto")
    _, dense, _ = load_model(path, dtype="float32", device="cpu", weight_format="auto")
    assert isinstance(quant.lm_head, QuantLinear) and (quant.lm_head is quant.embed) == tied
    for name in ("wqkv", "wo", "w_gate_up", "w_down"):
        kept, reference = quant.layers[1][name], dense.layers[1][name]
        assert isinstance(kept, QuantLinear) and isinstance(reference, torch.Tensor)
        # Exact: un-permuting Q/K and fusing move whole rows of blocks.
        assert torch.equal(kept.dequantize(), reference), name
    assert torch.equal(quant.lm_head.dequantize(), dense.lm_head)
