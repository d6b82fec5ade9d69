"""A real `python -m met.serve` process on 127.0.0.1 for the server tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = float(os.environ.get("MET_TEST_SERVER_TIMEOUT", "300"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    def __init__(self, *args: str, api_key: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        argv = [sys.executable, "-m", "met.serve", "--port", str(self.port), "--no-tui", *args]
        if os.environ.get("MET_TEST_MODEL"):
            argv += ["--model", os.environ["MET_TEST_MODEL"]]
        if api_key:
            argv += ["--api-key", api_key]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO / "python"), env.get("PYTHONPATH")])
        )
        fd, self.log_path = tempfile.mkstemp(prefix="met-serve-", suffix=".log")
        try:
            self.proc = subprocess.Popen(argv, env=env, stdout=fd, stderr=subprocess.STDOUT)
        finally:
            os.close(fd)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.logs()}")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def http(self, timeout: float = 60) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(), timeout=timeout)

    def openai(self, timeout: float = 60) -> openai.OpenAI:
        key = self.api_key or "unused"
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=timeout)

    def async_openai(self, timeout: float = 60) -> openai.AsyncOpenAI:
        key = self.api_key or "unused"
        return openai.AsyncOpenAI(
            base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=timeout
        )

    def logs(self) -> str:
        return Path(self.log_path).read_text(errors="replace")[-6000:]

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if os.environ.get("MET_TEST_KEEP_LOGS"):
            print(f"server log: {self.log_path}")
        else:
            os.unlink(self.log_path)
        return self.proc.returncode


def start_server(*args: str, api_key: str | None = None) -> ServerProcess:
    server = ServerProcess(*args, api_key=api_key)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server
