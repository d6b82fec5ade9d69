"""GGUF loading on tiny files written here the way llama.cpp's converter writes them."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
from family_fixtures import write_family_gguf
from gguf_writing import (
    Q,
    add_attention,
    add_bpe_tokenizer,
    add_shape,
    bpe_vocab,
    finish,
    permute_qk,
    store,
)
from model_fixtures import random_weights, tiny_config

import met
from met.engine.capacity import weight_bytes
from met.gguf_loader import load_gguf
from met.kernels.cpu_quant import QuantLinear
from met.model.capability import cannot_run
from met.model.config import ModelLoadError
from met.model.cpu_llama import CpuLlama
from met.models import load_model
from met.sampling import SamplingParams
from met.tokenizer import Tokenizer, byte_level_bytes

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


def write_tiny_gguf(
    path: Path,
    qtype: Q = Q.Q8_0,
    tied: bool = True,
    down: Q | None = None,
    pre: str = "smollm",
    **shape: int,
) -> tuple:
    """A tiny Llama GGUF; its linear weights in `qtype` (w_down and the embedding in `down` when
    given, as Q4_K_M files keep some tensors in Q6_K); `shape` overrides tiny_config's sizes."""
    config = tiny_config(vocab=len(bpe_vocab()), tie_embeddings=tied, **shape)
    weights = random_weights(config, seed=3)
    w = gguf.GGUFWriter(str(path), "llama")
    add_shape(w, config.n_layers, config.context_length, config.hidden, config.ffn)
    add_attention(w, config.n_heads, config.n_kv_heads, config.rope_theta, config.norm_eps)
    if config.sliding_window:  # Mistral 7B v0.1-style (llama.cpp's converter never writes it)
        w.add_sliding_window(config.sliding_window)
    add_bpe_tokenizer(w, pre, bos=1, eos=2)
    w.add_chat_template(TEMPLATE)
    store(w, "token_embd.weight", weights["embed"], down or qtype)
    if not tied:
        store(w, "output.weight", weights["lm_head"], qtype)
    store(w, "output_norm.weight", weights["norm"], Q.F32)
    for i in range(config.n_layers):
        for short, name in GGUF_NAMES.items():
            tensor = weights[f"layers.{i}.{short}"]
            if short in ("wq", "wk"):
                heads = config.n_heads if short == "wq" else config.n_kv_heads
                tensor = torch.from_numpy(permute_qk(tensor.numpy(), heads))
            kind = Q.F32 if short.endswith("norm") else qtype
            store(w, f"blk.{i}.{name}", tensor, down if down and short == "w_down" else kind)
    finish(w)
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
    vocab = bpe_vocab()
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
    finish(w)
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


@pytest.mark.parametrize(
    ("qtype", "tied"),
    [
        (Q.Q8_0, True),
        (Q.Q4_1, False),
        (Q.Q5_0, True),
        (Q.Q5_1, False),
        (Q.MXFP4, False),
        (Q.IQ4_NL, True),
    ],
)
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
        assert kept.qtype == qtype.name  # read as stored
        # Exact: un-permuting Q/K and fusing move whole rows of blocks.
        assert torch.equal(kept.dequantize(), reference), name
    assert torch.equal(quant.lm_head.dequantize(), dense.lm_head)


K_SHAPE = {"hidden": 256, "head_dim": 64, "ffn": 256}  # K-quant rows hold 256-weight blocks


# The super-block formats: bytes per 256 weights, as stored.
SUPER_BLOCK_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "IQ4_XS": 136}


@pytest.mark.parametrize(
    ("qtype", "down"),
    [(Q.Q4_K, Q.Q6_K), (Q.Q5_K, Q.Q6_K), (Q.IQ4_XS, None), (Q.Q3_K, Q.Q5_K), (Q.Q2_K, Q.Q3_K)],
)
def test_k_quant_files_run_on_the_kernels_formats(tmp_path, qtype, down):
    path = tmp_path / "tiny-k.gguf"
    write_tiny_gguf(path, qtype, tied=True, down=down, **K_SHAPE)
    _, quant, _ = load_model(path, device="cpu", weight_format="auto")
    _, dense, _ = load_model(path, dtype="float32", device="cpu", weight_format="auto")
    assert cannot_run(quant, "cpu") is None  # the C++ forward runs it
    kinds = {name: quant.layers[0][name].qtype for name in ("wqkv", "w_gate_up", "w_down")}
    assert kinds == {"wqkv": qtype.name, "w_gate_up": qtype.name, "w_down": (down or qtype).name}
    # Read as stored: the file's bytes (the same weights exactly), nothing wider.
    names = ("wqkv", "wo", "w_gate_up", "w_down")
    pairs = [(quant.layers[1][n], dense.layers[1][n]) for n in names]
    for kept, reference in [*pairs, (quant.embed, dense.embed)]:
        assert torch.equal(kept.dequantize(), reference), kept.qtype
        assert kept.nbytes == reference.numel() // 256 * SUPER_BLOCK_BYTES[kept.qtype]
    # What met doctor --model counts as the weights' memory: the file's tensor bytes, 1.00x.
    assert weight_bytes(quant) == sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)


def test_a_q4_k_m_style_file_serves_through_the_cpp_forward(tmp_path):
    path = tmp_path / "tiny-k.gguf"
    write_tiny_gguf(path, Q.Q4_K, tied=True, down=Q.Q6_K, **K_SHAPE)
    with met.LLM(str(path), device="cpu") as llm:
        assert isinstance(llm.engine.backend.model, CpuLlama)
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        out = llm.generate(prompt_token_ids=[[5, 6, 7, 8]], sampling_params=params)[0]
    assert len(out.token_ids) == 6


def _split_model(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A tiny Qwen2 written whole and split as gguf-split splits it: (whole file, parts)."""
    write_family_gguf(tmp_path / "whole.gguf", "qwen2", Q.Q8_0)
    (tmp_path / "split").mkdir()
    write_family_gguf(tmp_path / "split" / "m.gguf", "qwen2", Q.Q8_0, split_max_tensors=8)
    return tmp_path / "whole.gguf", sorted((tmp_path / "split").iterdir())


@pytest.mark.parametrize("keep_blocks", [False, True])
def test_a_split_model_loads_as_its_whole_file(tmp_path, keep_blocks):
    whole, parts = _split_model(tmp_path)
    count = len(parts)
    assert count > 2 and [p.name for p in parts] == [
        f"m-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)
    ]
    config, weights = load_gguf(whole, keep_blocks=keep_blocks)
    split_config, split_weights = load_gguf(parts[0], keep_blocks=keep_blocks)
    assert split_config == config and split_weights.keys() == weights.keys()
    for name, weight in weights.items():
        got = split_weights[name]
        if isinstance(weight, QuantLinear):
            weight, got = weight.blocks, got.blocks
        assert torch.equal(got, weight), name
    assert Tokenizer.from_gguf(parts[0]).encode("hello world") == Tokenizer.from_gguf(whole).encode(
        "hello world"
    )


def test_a_split_model_needs_every_part_and_its_first(tmp_path):
    _, parts = _split_model(tmp_path)
    split_in = f"part 2 of a model split in {len(parts)}; pass its first part"
    with pytest.raises(ModelLoadError, match=split_in):
        load_gguf(parts[1])
    parts[-1].unlink()
    with pytest.raises(ModelLoadError, match=f"part {parts[-1].name} is missing"):
        load_gguf(parts[0])
