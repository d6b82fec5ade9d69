"""`met pull user/repo[:QUANT]`, `--model user/repo[:QUANT]` and `met models` through the real
huggingface_hub client against a local stand-in for the Hub (hub_server.FakeHub): HF_ENDPOINT
points at it and HF_HOME, HF_HUB_CACHE and met's own cache are the test's, so nothing is fetched
from a real hub."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from family_fixtures import write_family_gguf, write_family_hf
from gguf_writing import Q
from hub_server import FakeHub
from met_cli_support import free_port, live_server, met_env, run_met
from openai import OpenAI

from met.commands.common import human_bytes
from met.gguf_loader import load_gguf
from met.models import load_model

REPO = "tester/Tiny-GGUF"
QUANTS = {"Tiny-Q4_K_M.gguf": Q.Q4_0, "Tiny-Q8_0.gguf": Q.Q8_0}  # Q4_K needs rows of 256+


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as served:
        yield served


@pytest.fixture(scope="module")
def gguf_repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A GGUF repo's files: two quants of a tiny Qwen2, a projector (never picked), a README."""
    folder = tmp_path_factory.mktemp("gguf")
    for name, qtype in QUANTS.items():
        write_family_gguf(folder / name, "qwen2", qtype)
    files = {name: (folder / name).read_bytes() for name in QUANTS}
    return files | {"mmproj-Tiny-F16.gguf": files["Tiny-Q8_0.gguf"], "README.md": b"# Tiny\n"}


def hub_env(tmp_path: Path, endpoint: str, **extra: str) -> dict[str, str]:
    """A `met` subprocess's environment: the Hub at `endpoint`, its cache and met's under
    tmp_path, no token, online unless `extra` says otherwise."""
    env = met_env(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(tmp_path / "hf"),
        HF_HUB_CACHE=str(tmp_path / "hf" / "hub"),
        MET_HOME=str(tmp_path / "met"),
        HF_HUB_DISABLE_TELEMETRY="1",
    )
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HUGGINGFACE_HUB_CACHE"):
        env.pop(name, None)
    return env | extra


def pull(tmp_path: Path, hub: FakeHub, name: str, **env: str):
    return run_met("pull", name, env=hub_env(tmp_path, hub.url, **env))


def resolve_url(hub: FakeHub, repo: str, name: str) -> str:
    return f"/{repo}/resolve/{hub.commit(repo)}/{name}"


def test_pull_picks_the_file_by_its_quant_tag(hub, gguf_repo, tmp_path) -> None:
    hub.add(REPO, gguf_repo)
    done = pull(tmp_path, hub, f"{REPO}:q8_0")  # the tag in any case
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.name == "Tiny-Q8_0.gguf" and path.read_bytes() == gguf_repo["Tiny-Q8_0.gguf"]
    assert f"met: {REPO}:q8_0: Tiny-Q8_0.gguf; the repo has Q4_K_M, Q8_0\n" in done.stderr
    assert [url for url, _ in hub.downloads()] == [resolve_url(hub, REPO, "Tiny-Q8_0.gguf")]
    untagged = pull(tmp_path, hub, REPO)  # no tag: Q4_K_M, as llama-server picks
    assert Path(untagged.stdout.strip()).name == "Tiny-Q4_K_M.gguf", untagged.stderr
    listed = run_met("models", env=hub_env(tmp_path, hub.url))
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert set(rows) == {f"{REPO}:Q4_K_M", f"{REPO}:Q8_0"}, listed.stdout
    size = human_bytes(len(gguf_repo["Tiny-Q8_0.gguf"]))
    assert f"  {size}  {path}" in rows[f"{REPO}:Q8_0"]


def test_a_split_gguf_is_pulled_whole_and_loads_as_one_model(hub, tmp_path) -> None:
    whole = tmp_path / "whole" / "Tiny-Q8_0.gguf"
    whole.parent.mkdir()
    write_family_gguf(whole, "qwen2", Q.Q8_0)
    (tmp_path / "split").mkdir()
    write_family_gguf(tmp_path / "split" / "Tiny-Q8_0.gguf", "qwen2", Q.Q8_0, split_max_tensors=8)
    parts = sorted((tmp_path / "split").iterdir())
    assert [p.name for p in parts][-1] == f"Tiny-Q8_0-{len(parts):05d}-of-{len(parts):05d}.gguf"
    hub.add(REPO, {p.name: p.read_bytes() for p in parts} | {"Tiny-Q4_K_M.gguf": b"GGUF"})
    done = pull(tmp_path, hub, f"{REPO}:Q8_0")
    assert done.returncode == 0, done.stderr
    first = Path(done.stdout.strip())
    assert first.name == parts[0].name and f"and its {len(parts) - 1} other parts" in done.stderr
    assert sorted(p.name for p in first.parent.iterdir()) == [p.name for p in parts]
    config, weights = load_gguf(whole)  # test_gguf compares the weights themselves
    split_config, split_weights = load_gguf(first)
    assert split_config == config and split_weights.keys() == weights.keys()


def test_a_safetensors_repo_pulls_what_a_folder_needs(hub, tmp_path) -> None:
    folder = tmp_path / "tiny"
    write_family_hf(folder, "qwen2")
    (folder / "generation_config.json").write_text('{"temperature": 0.6}')
    hub.add_folder("tester/Tiny", folder)
    hub.add("tester/Tiny", {"README.md": b"#", "pytorch_model.bin": b"x", "onnx/model.onnx": b"x"})
    done = pull(tmp_path, hub, "tester/Tiny")
    assert done.returncode == 0, done.stderr
    pulled = Path(done.stdout.strip())
    assert sorted(p.name for p in pulled.iterdir()) == sorted(p.name for p in folder.iterdir())
    assert "met: tester/Tiny: a safetensors folder (5 files)" in done.stderr
    config, _, tokenizer = load_model(pulled, device="cpu")
    assert config.family == "qwen2" and tokenizer.decode(tokenizer.encode("hi")) == "hi"
    listed = run_met("models", env=hub_env(tmp_path, hub.url)).stdout
    size = human_bytes(sum(f.stat().st_size for f in folder.iterdir()))
    assert listed == f"tester/Tiny  {size:>10}  {pulled}\n"


def test_offline_the_cache_is_used_and_said_in_one_line(hub, gguf_repo, tmp_path) -> None:
    hub.add(REPO, gguf_repo)
    online = pull(tmp_path, hub, f"{REPO}:Q8_0")
    assert online.returncode == 0, online.stderr
    asked = len(hub.requests)
    offline = pull(tmp_path, hub, f"{REPO}:Q8_0", HF_HUB_OFFLINE="1")
    assert offline.returncode == 0 and offline.stdout == online.stdout, offline.stderr
    assert offline.stderr.splitlines() == [
        f"met: {REPO}:Q8_0: Tiny-Q8_0.gguf; the repo has Q4_K_M, Q8_0 "
        "(offline, HF_HUB_OFFLINE is set: from the Hugging Face cache)"
    ]
    assert len(hub.requests) == asked  # not one request
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    unreachable = run_met("pull", f"{REPO}:Q8_0", env=hub_env(tmp_path, closed))
    assert unreachable.returncode == 0 and unreachable.stdout == online.stdout
    assert unreachable.stderr.splitlines() == [
        f"met: {REPO}:Q8_0: Tiny-Q8_0.gguf; the repo has Q4_K_M, Q8_0 "
        f"(offline, {closed} is unreachable (ConnectError): from the Hugging Face cache)"
    ]
    never = run_met("pull", "tester/Other", env=hub_env(tmp_path, closed))
    assert never.returncode == 1 and never.stderr.splitlines() == [
        f"met: error: tester/Other: {closed} is unreachable (ConnectError), and it is not in "
        "the Hugging Face cache"
    ]
    uncached = pull(tmp_path, hub, f"{REPO}:Q4_K_M", HF_HUB_OFFLINE="1")
    assert uncached.returncode == 1
    assert uncached.stderr.splitlines() == [
        f"met: error: {REPO}:Q4_K_M: HF_HUB_OFFLINE is set, and the cache lacks "
        f"Tiny-Q4_K_M.gguf; cached: {REPO}:Q8_0"
    ]


def test_a_missing_repo_or_quant_is_one_line_naming_what_exists(hub, gguf_repo, tmp_path) -> None:
    hub.add(REPO, gguf_repo)
    repo = pull(tmp_path, hub, "tester/nothing")
    assert repo.returncode == 1 and repo.stderr.splitlines() == [
        f"met: error: tester/nothing: no such model on {hub.url} (a private one needs a token: "
        "HF_TOKEN or `hf auth login`)"
    ]
    quant = pull(tmp_path, hub, f"{REPO}:Q5_K_S")
    assert quant.returncode == 1 and quant.stderr.splitlines() == [
        f"met: error: {REPO} has no Q5_K_S GGUF file; it has Q4_K_M, Q8_0"
    ]
    hub.add("tester/Gated", gguf_repo)
    hub.gated["tester/Gated"] = "hf_test_token"
    gated = pull(tmp_path, hub, "tester/Gated:Q8_0")
    assert gated.returncode == 1 and gated.stderr.splitlines() == [
        f"met: error: tester/Gated is gated on {hub.url}: accept its terms there and log in "
        "(HF_TOKEN or `hf auth login`)"
    ]
    neither = pull(tmp_path, hub, "tiny")
    assert neither.returncode == 1 and neither.stderr.splitlines() == [
        "met: error: unknown model 'tiny'; `met pull` fetches the default (smollm2) or "
        "user/repo[:QUANT] from the Hugging Face Hub"
    ]
    assert hub.downloads() == []


def test_the_hubs_token_reaches_a_gated_repo(hub, gguf_repo, tmp_path) -> None:
    hub.add("tester/Gated", gguf_repo)
    hub.gated["tester/Gated"] = "hf_test_token"
    done = pull(tmp_path, hub, "tester/Gated:Q8_0", HF_TOKEN="hf_test_token")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).read_bytes() == gguf_repo["Tiny-Q8_0.gguf"]


def test_a_download_cut_off_midway_resumes_where_it_stopped(hub, tmp_path) -> None:
    # Past one of the client's 10 MiB read chunks, so that part of the file is on disk when the
    # connection drops.
    data = b"GGUF" + os.urandom(12 << 20)
    hub.add("tester/Big-GGUF", {"Big-Q8_0.gguf": data})
    hub.cut["Big-Q8_0.gguf"] = 11 << 20
    done = pull(tmp_path, hub, "tester/Big-GGUF")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).read_bytes() == data
    url = resolve_url(hub, "tester/Big-GGUF", "Big-Q8_0.gguf")
    (first, whole), (again, resumed) = hub.downloads()
    assert first == again == url and whole is None
    start = int(resumed.removeprefix("bytes=").removesuffix("-"))
    assert 0 < start <= 11 << 20


def test_serve_answers_chat_with_a_model_from_the_hub(hub, gguf_repo, tmp_path) -> None:
    hub.add(REPO, gguf_repo)
    model = f"{REPO}:Q8_0"
    env = hub_env(tmp_path, hub.url)
    with live_server(model, free_port(), env=env) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == [model]
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
    assert reply.model == model and reply.choices[0].finish_reason in ("stop", "length")
    assert 1 <= reply.usage.completion_tokens <= 4
    assert [u for u, _ in hub.downloads()] == [resolve_url(hub, REPO, "Tiny-Q8_0.gguf")]


def test_run_and_doctor_take_a_hub_model(hub, gguf_repo, tmp_path) -> None:
    hub.add(REPO, gguf_repo)
    env = hub_env(tmp_path, hub.url)
    model = f"{REPO}:Q8_0"
    ran = run_met("run", "--model", model, "--max-tokens", "3", "--temperature", "0", "hi", env=env)
    assert ran.returncode == 0, ran.stderr
    doctor = run_met("doctor", "--model", model, env=env)
    assert "ok       capability     qwen2" in doctor.stdout, doctor.stdout
    assert "Tiny-Q8_0.gguf" in doctor.stdout  # the capacity probe loaded the pulled file
    assert doctor.stderr.count(f"met: {model}: Tiny-Q8_0.gguf") == 1  # resolved once
    assert len(hub.downloads()) == 1  # fetched by met run, then found in the cache
