"""Servers for benchmarks/serving.py: start one, wait for it, read its peak RSS, stop it cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx


@dataclass
class Server:
    """An engine under test: a process this script started, or a URL someone else serves."""

    name: str
    url: str
    command: list[str] | None = None  # None: already running at url
    env: dict[str, str] = field(default_factory=dict)
    pid: int | None = None  # for a server started elsewhere: where to read peak RSS


def met_server(model: str, port: int, threads: int, max_num_seqs: int, extra: list[str]) -> Server:
    # `met serve` has no thread flag: torch's intra-op pool and met's OpenMP kernels both read
    # OMP_NUM_THREADS, and without it they use every core.
    command = [sys.executable, "-m", "met.cli", "serve", "--model", model]
    command += ["--host", "127.0.0.1", "--port", str(port), "--no-tui"]
    command += ["--max-num-seqs", str(max_num_seqs), "--log-level", "warning", *extra]
    env = {"OMP_NUM_THREADS": str(threads), "MET_NO_TUI": "1"}
    return Server("met", f"http://127.0.0.1:{port}", command, env)


def llama_cpp_server(model: str, port: int, threads: int, extra: list[str]) -> Server:
    # llama-cpp-python's server runs one request at a time behind a lock (no parallel slots);
    # by default a new request also cuts the running one short (interrupt_requests), which
    # under concurrency would end answers early, so it is turned off: requests queue instead.
    command = [sys.executable, "-m", "llama_cpp.server", "--model", model]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    command += ["--n_threads", str(threads), "--n_threads_batch", str(threads)]
    command += ["--interrupt_requests", "False", *extra]
    return Server("llama-cpp-python", f"http://127.0.0.1:{port}", command)


@contextlib.contextmanager
def running(server: Server, log_path: Path, startup_timeout: float) -> Iterator[Server]:
    """Start the server (unless it is already running), wait until it answers, stop it after.

    The server gets its own process group, so a Ctrl+C in the terminal reaches only this script,
    which then stops the group: SIGTERM, then SIGKILL after a grace period.
    """
    if server.command is None:
        wait_ready(server.url, None, startup_timeout)
        yield server
        return
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            server.command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **server.env},
            start_new_session=True,
        )
        server.pid = proc.pid
        try:
            wait_ready(server.url, proc, startup_timeout, log_path)
            yield server
        finally:
            stop(proc)


def wait_ready(
    url: str,
    proc: subprocess.Popen | None,
    timeout: float,
    log_path: Path | None = None,
) -> None:
    """Until /health says 200, or, on servers without /health (404), /v1/models lists a model."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path else ""
            raise RuntimeError(f"server exited with {proc.returncode} while starting:\n{tail}")
        if _answers(url):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout:.0f} s")


def _answers(url: str) -> bool:
    try:
        health = httpx.get(f"{url}/health", timeout=5.0)
        if health.status_code == 200:
            return True
        if health.status_code != 404:
            return False
        models = httpx.get(f"{url}/v1/models", timeout=5.0)
        return models.status_code == 200 and bool(models.json().get("data"))
    except (httpx.HTTPError, ValueError):
        return False


def stop(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM to the server's process group, SIGKILL if it is still there after grace seconds."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10.0)


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(k) for k in f.read().split()]
    return kids


def _status_field(pid: int, name: str) -> str | None:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{name}:"):
                return line.split(":", 1)[1].strip()
    return None


def peak_rss(pid: int) -> dict:
    """VmHWM (peak resident set) of pid and every descendant, in MiB; total is their sum.

    The sum is an upper bound on the peak of the whole tree: the processes need not have peaked
    at the same moment. Shared pages (the mmapped model file) count once per process.
    """
    processes = {}
    pending = [pid]
    while pending:
        current = pending.pop()
        hwm = _status_field(current, "VmHWM")
        if hwm is not None:
            name = _status_field(current, "Name") or "?"
            processes[str(current)] = {"name": name, "vmhwm_mib": int(hwm.split()[0]) / 1024}
        pending += _children(current)
    total = sum(p["vmhwm_mib"] for p in processes.values())
    return {"total_mib": total if processes else None, "processes": processes}
