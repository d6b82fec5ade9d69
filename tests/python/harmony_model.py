"""A tiny random gpt-oss GGUF with the real o200k_harmony vocabulary, so that openai-harmony's
token ids are the model's: the tokens and ranks of OpenAI's o200k_base file (met.chat.harmony's
offline copy), harmony's special tokens after them, and the BPE merges derived from the ranks
(each token's merge: its two parts as byte-pair encoding under the lower ranks splits it)."""

from __future__ import annotations

import base64
import functools

import gguf

from met.chat import harmony

N_VOCAB = 201088  # o200k_harmony: 199998 ranked tokens, then the special and reserved ones
# Enough of a harmony chat template for met's setup to know the format (<|channel|>); met renders
# prompts with openai-harmony, not with this.
TEMPLATE = (
    "{%- for m in messages %}<|start|>{{ m.role }}"
    "{%- if m.role == 'assistant' %}<|channel|>final{% endif %}"
    "<|message|>{{ m.content }}<|end|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{% endif %}"
)


@functools.cache
def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's byte-level alphabet, as GGUF BPE vocabularies spell tokens.
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _merge_of(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts byte-pair encoding with the ranks below token's own leaves it in."""
    limit = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = limit, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], limit)
            if rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts[0], b"".join(parts[1:])


@functools.cache
def harmony_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of o200k_harmony in GGUF's byte-level spelling."""
    ranked: list[bytes] = []
    for line in (harmony.vocab_dir() / harmony.VOCAB_FILE).read_bytes().splitlines():
        token, rank = line.split()
        assert int(rank) == len(ranked)
        ranked.append(base64.b64decode(token))
    ranks = {t: i for i, t in enumerate(ranked)}
    spell = _bytes_to_unicode()
    tokens = ["".join(spell[b] for b in t) for t in ranked]
    merges = []
    for t in ranked:
        if len(t) > 1:
            a, b = _merge_of(t, ranks)
            merges.append("".join(spell[x] for x in a) + " " + "".join(spell[x] for x in b))
    enc = harmony.encoding()
    specials = [enc.decode([i]) for i in range(len(ranked), N_VOCAB)]
    types = [1] * len(tokens) + [3] * len(specials)
    return tokens + specials, types, merges


def add_harmony_tokenizer(w: gguf.GGUFWriter) -> None:
    """o200k_harmony as the file's tokenizer (gpt-4o pre-tokenization), with its template."""
    tokens, types, merges = harmony_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|startoftext|>"))
    w.add_eos_token_id(tokens.index("<|return|>"))
    w.add_chat_template(TEMPLATE)
