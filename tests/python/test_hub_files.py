"""Which files of a Hub repo `user/repo[:QUANT]` names (met.hub_files), what reads as a Hub name
at all (met.hub.parse_ref) and what name a Hub model is served by; no network."""

from __future__ import annotations

import pytest
from huggingface_hub import constants

from met.hub import HubRef, parse_ref, served_name
from met.hub_files import HubFilesError, choose, quant_of

GGUF_REPO = [
    "README.md",
    "Model-Q4_K_M.gguf",
    "Model-Q8_0.gguf",
    "Model-UD-Q4_K_XL.gguf",
    "Model-IQ4_XS.gguf",
    "Model.BF16.gguf",
    "mmproj-Model-F16.gguf",
    "F16/Model-F16-00001-of-00002.gguf",
    "F16/Model-F16-00002-of-00002.gguf",
]


@pytest.mark.parametrize(
    ("tag", "picked"),
    [
        (None, "Model-Q4_K_M.gguf"),  # no tag: Q4_K_M, as llama-server
        ("q8_0", "Model-Q8_0.gguf"),  # any case
        ("Q4_K_XL", "Model-UD-Q4_K_XL.gguf"),  # a tag the name ends with
        ("iq4_xs", "Model-IQ4_XS.gguf"),
        ("BF16", "Model.BF16.gguf"),
        ("F16", "F16/Model-F16-00001-of-00002.gguf"),  # not BF16, nor the projector
    ],
)
def test_the_tag_picks_the_file(tag: str | None, picked: str) -> None:
    assert choose("u/r", GGUF_REPO, tag).gguf == picked


def test_a_split_model_is_all_its_parts() -> None:
    choice = choose("u/r", GGUF_REPO, "F16")
    assert choice.files == [f"F16/Model-F16-0000{i}-of-00002.gguf" for i in (1, 2)]
    with pytest.raises(HubFilesError, match="lacks F16/Model-F16-00002-of-00002.gguf"):
        choose("u/r", GGUF_REPO[:-1], "F16")


def test_without_q4_k_m_the_first_gguf_is_taken() -> None:
    assert choose("u/r", ["b-Q8_0.gguf", "a-Q6_K.gguf"], None).gguf == "a-Q6_K.gguf"


def test_a_missing_quant_names_the_quants_the_repo_has() -> None:
    with pytest.raises(HubFilesError) as caught:
        choose("u/r", GGUF_REPO, "Q5_K_S")
    assert str(caught.value) == (
        "u/r has no Q5_K_S GGUF file; it has F16, IQ4_XS, Q4_K_M, Q8_0, UD-Q4_K_XL, BF16"
    )
    # A tag must match a whole quant: Q4_K is not Q4_K_M.
    with pytest.raises(HubFilesError, match="no Q4_K GGUF"):
        choose("u/r", GGUF_REPO, "Q4_K")


def test_a_safetensors_repo_is_the_folder_files() -> None:
    repo = [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "README.md",
        "pytorch_model.bin",
        "onnx/model.onnx",
        "original/consolidated.safetensors",
    ]
    choice = choose("u/r", repo, None)
    assert choice.gguf is None
    assert choice.files == sorted(repo[:8])
    with pytest.raises(HubFilesError, match="u/r has no GGUF files, so no quant Q8_0"):
        choose("u/r", repo, "Q8_0")
    with pytest.raises(HubFilesError, match="neither GGUF files nor safetensors.*README.md"):
        choose("u/r", ["README.md", "config.json"], None)


def test_quant_of_reads_the_last_tag() -> None:
    assert quant_of("Qwen2.5-7B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert quant_of("x-UD-Q4_K_XL-00001-of-00003.gguf") == "UD-Q4_K_XL"
    assert quant_of("model.gguf") is None


@pytest.mark.parametrize(
    ("name", "ref"),
    [
        ("bartowski/SmolLM2-135M-Instruct-GGUF", HubRef("bartowski/SmolLM2-135M-Instruct-GGUF")),
        ("user/repo:Q8_0", HubRef("user/repo", "Q8_0")),
        ("Qwen/Qwen2.5-0.5B-Instruct", HubRef("Qwen/Qwen2.5-0.5B-Instruct")),
        ("models/tiny.gguf", None),  # a path
        ("./user/repo", None),
        ("~/models/x", None),
        ("/abs/path", None),
        ("smollm2", None),
        ("a/b/c", None),
    ],
)
def test_what_reads_as_a_hub_name(name: str, ref: HubRef | None) -> None:
    assert parse_ref(name) == ref


def test_a_model_from_the_hub_cache_is_served_by_the_name_it_was_asked_by(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = tmp_path / "hub" / "models--u--r" / "snapshots" / ("0" * 40)
    assert served_name("u/r:Q8_0", snapshot / "r-Q8_0.gguf") == "u/r:Q8_0"
    assert served_name("u/r", snapshot) == "u/r"
    # A local folder that happens to be named user/repo keeps its own name.
    assert served_name("u/r", tmp_path / "u" / "r") is None
    assert served_name(None, snapshot) is None
