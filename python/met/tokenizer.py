"""Tokenizer: the `tokenizers` library for encoding, per-token byte tables for decoding.

Decoding goes through one bytes table (token id -> raw bytes) so that full decodes and the
streaming IncrementalDetokenizer can never disagree, and so a character split across tokens is
only emitted once all its bytes have arrived.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HfTokenizer

from met.hf_loader import hf_chat_template, read_json
from met.model.config import ModelLoadError
from met.pretokenize import byte_level_pre, ignores_merges, pre_type

# GGUF token types (llama.cpp's llama_token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_SPM_SPACE = "\u2581"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_to_unicode() -> dict[int, str]:
    # GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the rest are
    # shifted to code points from 256 up so that every byte has a visible, unique character.
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def byte_level_bytes(tokens: Sequence[str], literal: set[int]) -> list[bytes]:
    """Raw bytes of byte-level BPE tokens; ids in `literal` (added tokens) are plain text."""
    to_byte = {c: b for b, c in _byte_to_unicode().items()}
    out = []
    for i, token in enumerate(tokens):
        if i in literal or any(c not in to_byte for c in token):
            out.append(token.encode("utf-8"))
        else:
            out.append(bytes(to_byte[c] for c in token))
    return out


def spm_bytes(tokens: Sequence[str]) -> list[bytes]:
    """Raw bytes of SentencePiece tokens: <0xAB> byte-fallback pieces and U+2581 for spaces."""
    out = []
    for token in tokens:
        match = _BYTE_TOKEN.fullmatch(token)
        if match:
            out.append(bytes([int(match.group(1), 16)]))
        else:
            out.append(token.replace(_SPM_SPACE, " ").encode("utf-8"))
    return out


def _spm_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    # SentencePiece BPE merges the pair whose result has the highest score; recover a merge list
    # in that priority order from the vocabulary alone.
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for token, score in zip(tokens, scores, strict=True):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


class Tokenizer:
    """Encode/decode plus the model's chat template. Build with from_gguf or from_hf_folder."""

    def __init__(
        self,
        backend: HfTokenizer,
        token_bytes: list[bytes],
        special_ids: Iterable[int],
        eos_token_ids: list[int],
        bos_token: str | None = None,
        eos_token: str | None = None,
        chat_template: str | None = None,
    ) -> None:
        self._backend = backend
        # Control tokens are never read out of text: only the chat template can produce them.
        self._backend.encode_special_tokens = True
        self._token_bytes = token_bytes
        self.special_ids = frozenset(special_ids)
        self.eos_token_ids = list(eos_token_ids)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.chat_template = chat_template
        self._special_by_text = {
            self._token_bytes[i].decode("utf-8", "replace"): i for i in sorted(self.special_ids)
        }
        alternatives = sorted(self._special_by_text, key=len, reverse=True)
        self._special_re = (
            re.compile("|".join(map(re.escape, alternatives))) if alternatives else None
        )

    @property
    def vocab_size(self) -> int:
        return len(self._token_bytes)

    def token_bytes(self, token_id: int) -> bytes:
        return self._token_bytes[token_id]

    def special_id(self, text: str) -> int | None:
        """The id of the control token whose text is `text`, if the model has one."""
        return self._special_by_text.get(text)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of `text`; text that looks like a control token stays plain text."""
        return self._backend.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self._join_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def _join_bytes(self, ids: Iterable[int], skip_special: bool) -> bytes:
        table = self._token_bytes
        if skip_special:
            return b"".join(table[i] for i in ids if i not in self.special_ids)
        return b"".join(table[i] for i in ids)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """Render the model's own chat template (sandboxed jinja2, Hugging Face conventions)."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; use a completion request instead")
        try:
            template = _jinja_env().from_string(self.chat_template)
            return template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **extra,
            )
        except TemplateError as exc:
            raise ValueError(f"chat template: {exc}") from exc

    def encode_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> list[int]:
        """Token ids of the rendered chat; control tokens only where the template put them."""
        marker = _free_marker(messages)
        guarded = [self._guard(m, marker) for m in messages]
        text = self.apply_chat_template(guarded, add_generation_prompt, **extra)
        ids: list[int] = []
        pos = 0
        # Contents had a marker wedged into every control-token string, so each exact match left
        # in the rendered text was written by the template itself.
        for match in self._special_re.finditer(text) if self._special_re else ():
            ids += self.encode(text[pos : match.start()].replace(marker, ""))
            ids.append(self._special_by_text[match.group()])
            pos = match.end()
        ids += self.encode(text[pos:].replace(marker, ""))
        return ids

    def _guard(self, message: dict[str, Any], marker: str) -> dict[str, Any]:
        content = message.get("content")
        if not isinstance(content, str) or self._special_re is None:
            return message
        return {**message, "content": self._special_re.sub(lambda m: _wedge(m, marker), content)}

    @classmethod
    def from_gguf(cls, path: str | Path, reader: Any = None) -> Tokenizer:
        """From a GGUF file; pass an open GGUFReader to skip parsing the file again (seconds)."""
        from met.gguf_loader import field_value, open_gguf, read_config

        reader = reader or open_gguf(path)
        # First, so that a file of an architecture met cannot run says so before anything else.
        eos_token_ids = read_config(reader, path).eos_token_ids
        kind = field_value(reader, "tokenizer.ggml.model")
        tokens = field_value(reader, "tokenizer.ggml.tokens")
        if not tokens:
            raise ModelLoadError(f"{path}: the GGUF file carries no tokenizer vocabulary")
        types = field_value(reader, "tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
        special = {i for i, t in enumerate(types) if t == _CONTROL}
        user_defined = {i for i, t in enumerate(types) if t == _USER_DEFINED}
        if kind == "gpt2":
            merges = [tuple(m.split(" ", 1)) for m in field_value(reader, "tokenizer.ggml.merges")]
            try:
                pre = pre_type(field_value(reader, "tokenizer.ggml.pre"))
            except ModelLoadError as exc:
                raise ModelLoadError(f"{path}: {exc}") from None
            vocab = {t: i for i, t in enumerate(tokens)}
            backend = HfTokenizer(models.BPE(vocab, merges, ignore_merges=ignores_merges(pre)))
            backend.pre_tokenizer = byte_level_pre(pre)
            backend.decoder = decoders.ByteLevel()
            table = byte_level_bytes(tokens, special | user_defined)
        elif kind == "llama":
            backend = _spm_backend(reader, tokens, types)
            table = spm_bytes(tokens)
        else:
            raise ModelLoadError(
                f"{path}: tokenizer model {kind!r} is not supported (gpt2 byte-level BPE or "
                "llama SentencePiece); load the model from its Hugging Face folder instead"
            )
        backend.add_special_tokens([_added(tokens[i], True) for i in sorted(special)])
        backend.add_tokens([_added(tokens[i], False) for i in sorted(user_defined)])

        def token_text(key: str) -> str | None:
            token_id = field_value(reader, f"tokenizer.ggml.{key}")
            return None if token_id is None else tokens[token_id]

        _add_bos_eos(backend, reader, tokens)
        return cls(
            backend,
            table,
            special,
            eos_token_ids,
            bos_token=token_text("bos_token_id"),
            eos_token=token_text("eos_token_id"),
            chat_template=field_value(reader, "tokenizer.chat_template"),
        )

    @classmethod
    def from_hf_folder(
        cls, folder: str | Path, eos_token_ids: list[int] | None = None
    ) -> Tokenizer:
        folder = Path(folder)
        try:
            backend = HfTokenizer.from_file(str(folder / "tokenizer.json"))
            spec = json.loads((folder / "tokenizer.json").read_text())
        except Exception as exc:
            raise ModelLoadError(
                f"{folder}: tokenizer.json is missing or unreadable ({exc}); download it with "
                "the model"
            ) from exc
        settings = read_json(folder / "tokenizer_config.json")
        vocab = backend.get_vocab(with_added_tokens=True)
        tokens = [""] * (max(vocab.values()) + 1)
        for text, i in vocab.items():
            tokens[i] = text
        added = spec.get("added_tokens", [])
        special = {t["id"] for t in added if t.get("special")}
        if _uses_byte_level(spec.get("decoder")):
            table = byte_level_bytes(tokens, {t["id"] for t in added})
        else:
            table = spm_bytes(tokens)
        bos, eos = _token_setting(settings, "bos_token"), _token_setting(settings, "eos_token")
        if eos_token_ids is None:
            eos_token_ids = [vocab[eos]] if eos in vocab else []
        return cls(
            backend,
            table,
            special,
            eos_token_ids,
            bos_token=bos,
            eos_token=eos,
            chat_template=hf_chat_template(settings),
        )


class IncrementalDetokenizer:
    """Per-request streaming decode: push ids, get only text whose bytes are complete."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        # The incremental UTF-8 decoder holds back a trailing partial character between pushes.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if self._skip_special and token_id in self._tokenizer.special_ids:
            return ""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is still held back (an unfinished character becomes U+FFFD)."""
        return self._utf8.decode(b"", final=True)


def _add_bos_eos(backend: HfTokenizer, reader: Any, tokens: list[str]) -> None:
    """encode(add_special=True) prepends BOS and appends EOS where the file says so, as llama.cpp
    does (an embedding model pooling the last token is converted with add_eos_token)."""
    from met.gguf_loader import field_value

    ends = []
    for end in ("bos", "eos"):
        token_id = field_value(reader, f"tokenizer.ggml.{end}_token_id")
        if token_id is not None and field_value(reader, f"tokenizer.ggml.add_{end}_token", False):
            ends.append((end, tokens[token_id], token_id))
    if not ends:
        return
    names = {end: text for end, text, _ in ends}
    single = " ".join(filter(None, [names.get("bos"), "$A", names.get("eos")]))
    special = [(text, token_id) for _, text, token_id in ends]
    backend.post_processor = processors.TemplateProcessing(single=single, special_tokens=special)


def _wedge(match: re.Match[str], marker: str) -> str:
    text = match.group()
    return text[:1] + marker + text[1:]


def _free_marker(messages: list[dict[str, Any]]) -> str:
    # A private-use character no message contains, so removing it later restores the text exactly.
    used = "".join(str(m.get("content", "")) for m in messages)
    for code in range(0xE000, 0xF900):
        if chr(code) not in used:
            return chr(code)
    raise ValueError("messages use every private-use character; cannot guard control tokens")


def _added(text: str, special: bool) -> AddedToken:
    return AddedToken(text, special=special, normalized=False)


def _spm_backend(reader: Any, tokens: list[str], types: list[int]) -> HfTokenizer:
    from met.gguf_loader import field_value

    scores = field_value(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens)
    kinds = list(zip(tokens, types, strict=True))
    mergeable = [t if ty in (_NORMAL, _USER_DEFINED) else "" for t, ty in kinds]
    unk = next((t for t, ty in kinds if ty == _UNKNOWN), None)
    backend = HfTokenizer(
        models.BPE(
            {t: i for i, t in enumerate(tokens)},
            _spm_merges(mergeable, scores),
            unk_token=unk,
            byte_fallback=True,
            fuse_unk=True,
        )
    )
    prepend = field_value(reader, "tokenizer.ggml.add_space_prefix", True)
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=_SPM_SPACE, prepend_scheme="first" if prepend else "never", split=False
    )
    return backend


def _uses_byte_level(decoder: dict[str, Any] | None) -> bool:
    if not decoder:
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    return any(_uses_byte_level(d) for d in decoder.get("decoders", []))


def _token_setting(settings: dict[str, Any], key: str) -> str | None:
    value = settings.get(key)
    return value.get("content") if isinstance(value, dict) else value


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_ENV: ImmutableSandboxedEnvironment | None = None


def _jinja_env() -> ImmutableSandboxedEnvironment:
    global _ENV
    if _ENV is None:
        # Hugging Face renders chat templates with these settings; templates are written for them.
        _ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        _ENV.globals["raise_exception"] = _raise_exception
        _ENV.globals["strftime_now"] = _strftime_now
    return _ENV
