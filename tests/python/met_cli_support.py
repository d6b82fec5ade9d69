"""Helpers for tests that run `met` as a user would: as a subprocess, and a live server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"


def met_env(**extra: str) -> dict[str, str]:
    """The environment for a `met` subprocess: this checkout's package first, no dashboard."""
    path = os.pathsep.join(filter(None, [str(PYTHON_DIR), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, MET_NO_TUI="1", **extra)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_met(
    *args: str, stdin: str | None = None, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`met ARGS` in a subprocess; `env` replaces met_env()'s environment."""
    return subprocess.run(
        [sys.executable, "-m", "met.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env or met_env(),
        timeout=timeout,
    )


@contextmanager
def live_server(
    model: Path | str, port: int, *extra: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """A real `met serve --no-tui` on a local port; yields its base URL once /health is 200.
    `env` replaces met_env()'s environment."""
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"met-test-serve-{port}.log", "w")  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "met.cli",
            "serve",
            "--no-tui",
            "--port",
            str(port),
            "--model",
            str(model),
            "--max-num-seqs",
            "4",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env or met_env(),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, log.name)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_ready(url: str, process: subprocess.Popen, log_name: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"met serve exited early: {Path(log_name).read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(
        f"met serve not ready after {timeout} s: {Path(log_name).read_text()[-2000:]}"
    )
