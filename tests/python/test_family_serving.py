"""`met serve --model <family>.gguf` serves chat for every family met runs: the tests' tiny
random-weight GGUF file of each family behind a real server, asked through the openai client,
plain and streamed, with the family's chat template counting the prompt."""

from __future__ import annotations

import pytest
from family_fixtures import FAMILIES, write_family_gguf
from server_harness import start_server

import met

pytestmark = pytest.mark.slow

ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_met_serve_answers_chat_on_each_family(tmp_path, family: str) -> None:
    path = tmp_path / f"{family}.gguf"
    write_family_gguf(path, family)
    llm = met.LLM(model=str(path), device="cpu")
    try:
        prompt_tokens = len(llm.tokenizer.encode_chat(ASK))
    finally:
        llm.close()
    server = start_server("--model", str(path), "--served-model-name", family)
    try:
        client = server.openai()
        assert [m.id for m in client.models.list().data] == [family]
        reply = client.chat.completions.create(
            model=family, messages=ASK, max_tokens=4, temperature=0
        )
        choice = reply.choices[0]
        assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
        assert reply.usage.prompt_tokens == prompt_tokens
        assert 1 <= reply.usage.completion_tokens <= 4
        stream = client.chat.completions.create(
            model=family, messages=ASK, max_tokens=4, temperature=0, stream=True
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert streamed == choice.message.content
    finally:
        assert server.stop() == 0
