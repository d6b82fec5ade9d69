"""/v1/embeddings and /v1/rerank (met.engine.pooling, met.server.embeddings) through the openai
client and httpx, on tiny random Qwen3-architecture models the tests write: an embedding model
as a sentence-transformers folder (last-token pooling in 1_Pooling/config.json) and as a GGUF file
(qwen3.pooling_type = LAST), both against transformers' own forward with the same pooling; a
Qwen3-Reranker-style model served with --pooling rank against transformers' P(yes) logits."""

from __future__ import annotations

import base64
import json
import struct

import gguf
import httpx
import openai
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from gguf_writing import Q
from hf_reference import build_hf, save_hf, write_gguf
from model_fixtures import byte_tokenizer_json
from server_harness import start_server
from tokenizers import Tokenizer as HfTokenizer

TOL = 1e-4  # float32 weights: met and transformers differ in summation order only
IDS = [[5, 17, 33, 60, 91, 100, 7], [104, 14, 3], list(range(40, 80))]  # < both vocabularies


def _embedder(vocab: int | None = None):
    # The folder's byte-level tokenizer has 256 ids; the GGUF's BPE one its own (hf_reference).
    return build_hf("qwen3", seed=7, **({"vocab_size": vocab} if vocab else {}))


@torch.inference_mode()
def _reference(model, ids: list[int]) -> torch.Tensor:
    """transformers' last hidden state (after the final norm) at the last token, L2-normalized."""
    hidden = model.model(torch.tensor([ids])).last_hidden_state[0, -1]
    return F.normalize(hidden.float(), dim=-1)


@pytest.fixture(scope="module")
def embedding_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("embed")
    models = {"emb-hf": _embedder(256), "emb-gguf": _embedder()}
    hf = save_hf(models["emb-hf"], folder / "emb-hf")
    (hf / "1_Pooling").mkdir()
    (hf / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))

    def last_pooling(w: gguf.GGUFWriter) -> None:
        w.add_pooling_type(gguf.PoolingType.LAST)
        w.add_add_eos_token(True)  # as llama.cpp converts Qwen3-Embedding

    emb_gguf = write_gguf(
        models["emb-gguf"], folder / "emb-gguf.gguf", "qwen3", Q.F32, metadata=last_pooling
    )
    chat = write_gguf(build_hf("qwen3", seed=3), folder / "chat.gguf", "qwen3")
    server = start_server("--model", str(hf), "--model", str(emb_gguf), "--model", str(chat))
    yield server, models, hf
    assert server.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["emb-hf", "emb-gguf"])
def test_embeddings_match_transformers(embedding_server, name):
    server, models, _ = embedding_server
    model = models[name]
    reply = server.openai().embeddings.create(model=name, input=IDS)
    assert reply.model == name and [d.index for d in reply.data] == [0, 1, 2]
    assert reply.usage.prompt_tokens == sum(len(ids) for ids in IDS)
    for ids, item in zip(IDS, reply.data, strict=True):
        got = torch.tensor(item.embedding)
        assert torch.allclose(got, _reference(model, ids), atol=TOL), name
        assert abs(float(got.norm()) - 1.0) < 1e-5


@pytest.mark.slow
def test_embeddings_of_text_dimensions_and_base64(embedding_server):
    server, models, folder = embedding_server
    model = models["emb-hf"]
    client = server.openai()
    text = client.embeddings.create(model="emb-hf", input="a cat")
    ids = HfTokenizer.from_file(str(folder / "tokenizer.json")).encode("a cat").ids
    assert text.usage.prompt_tokens == len(ids)
    assert torch.allclose(torch.tensor(text.data[0].embedding), _reference(model, ids), atol=TOL)
    short = client.embeddings.create(model="emb-hf", input=[IDS[0]], dimensions=8)
    want = F.normalize(_reference(model, IDS[0])[:8], dim=-1)
    assert torch.allclose(torch.tensor(short.data[0].embedding), want, atol=TOL)
    raw = server.http().post(
        "/v1/embeddings",
        json={"model": "emb-hf", "input": IDS[1], "encoding_format": "base64"},
    )
    packed = base64.b64decode(raw.json()["data"][0]["embedding"])
    floats = torch.tensor(struct.unpack(f"<{len(packed) // 4}f", packed))
    assert torch.allclose(floats, _reference(model, IDS[1]), atol=TOL)
    # The GGUF says add_eos_token: a text input ends with EOS (id 2), as llama.cpp embeds it.
    plain = server.http().post("/tokenize", json={"model": "emb-gguf", "prompt": "a cat"})
    ids = plain.json()["tokens"] + [2]
    text = client.embeddings.create(model="emb-gguf", input="a cat")
    assert text.usage.prompt_tokens == len(ids)
    want = _reference(models["emb-gguf"], ids)
    assert torch.allclose(torch.tensor(text.data[0].embedding), want, atol=TOL)
    status = server.http().get("/status").json()
    assert status["stats"]["kv_blocks_used"] == 0  # the pooled prompts kept no KV


@pytest.mark.slow
def test_embedding_refusals(embedding_server):
    server, _, _ = embedding_server
    client = server.openai()
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="chat", input="hi")
    assert "not an embedding model" in e.value.message and "--pooling" in e.value.message
    for bad, param in (("", "input"), ([[]], "input"), ([[999]], "input"), ([[1] * 300], "input")):
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model="emb-hf", input=bad)
        assert e.value.body["param"] == param, bad
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="emb-hf", input="hi", dimensions=0)
    assert client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    ).choices


def _answer_tokenizer() -> str:
    """A byte-level BPE tokenizer whose 'yes' and 'no' are one token each (ids 257 and 258)."""
    return byte_tokenizer_json(["y e", "ye s", "n o"])


def _rerank_prompt(query: str, document: str) -> str:
    # Qwen3-Reranker's format, written out here independently of met's.
    system = (
        "Judge whether the Document meets the requirements based on the Query and the Instruct "
        'provided. Note that the answer can only be "yes" or "no".'
    )
    task = "Given a web search query, retrieve relevant passages that answer the query"
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n<Instruct>: {task}\n"
        f"<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n"
        "<think>\n\n</think>\n\n"
    )


@pytest.mark.slow
def test_rerank_scores_as_transformers(tmp_path):
    model = build_hf("qwen3", seed=11, vocab_size=259, max_position_embeddings=512)
    folder = save_hf(model, tmp_path / "reranker")
    (folder / "tokenizer.json").write_text(_answer_tokenizer())
    tokenizer = HfTokenizer.from_str(_answer_tokenizer())
    query, docs = "cats", ["a cat sat", "stock prices", "kittens play", "rain"]
    want = []
    with torch.inference_mode():
        for doc in docs:
            ids = tokenizer.encode(_rerank_prompt(query, doc)).ids
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            want.append(float(torch.softmax(logits[[257, 258]], dim=0)[0]))
    server = start_server("--model", str(folder), "--pooling", "rank")
    try:
        reply = httpx.post(
            server.url + "/v1/rerank",
            json={"query": query, "documents": docs, "top_n": 3},
            timeout=60,
        ).json()
        order = sorted(range(len(docs)), key=lambda i: -want[i])[:3]
        assert [r["index"] for r in reply["results"]] == order
        for result in reply["results"]:
            assert abs(result["relevance_score"] - want[result["index"]]) < 1e-4
            assert result["document"]["text"] == docs[result["index"]]
        refused = httpx.post(server.url + "/v1/embeddings", json={"input": "x"}, timeout=60)
        assert refused.status_code == 400 and "not an embedding model" in refused.text
    finally:
        assert server.stop() == 0
