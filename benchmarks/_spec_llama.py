"""The peer of benchmarks/speculative.py: llama-server on the same GGUF, with its own n-gram
speculation (`--spec-type ngram-simple`) and without (`none`), driven through its /completion
endpoint with the very token ids met gets (greedy, streamed, the prompt cache off), timed like
met's requests: decode tokens/s from the first streamed token to the last, per request.

llama-server reports each request's drafted and accepted tokens in its timings; the mean
accepted length per draft comes from its log (`mean len`, which counts the target's own token).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# met drafts up to 4 tokens after a 4- to 2-token match; llama-server's ngram-simple looks up an
# n-token match (default 12, which copies of a few hundred tokens rarely reach) and drafts m.
DRAFT_M = 4
SPEC_ARGS = [
    "--spec-type",
    "ngram-simple",
    "--spec-ngram-simple-size-n",
    "3",
    "--spec-ngram-simple-size-m",
    str(DRAFT_M),
]
_MEAN_LEN = re.compile(
    r"draft acceptance = [0-9.]+ \(\s*(\d+) accepted /\s*(\d+) generated\), mean len =\s*([0-9.]+)"
)


@dataclass
class PeerRequest:
    tokens: list[int] = field(default_factory=list)
    first: float | None = None
    last: float = 0.0
    drafted: int = 0
    accepted: int = 0

    def decode_rate(self) -> float | None:
        if self.first is None or len(self.tokens) < 2 or self.last <= self.first:
            return None
        return (len(self.tokens) - 1) / (self.last - self.first)


class LlamaServer:
    """One llama-server process on 127.0.0.1 (a free port), `width` slots, 2 threads."""

    def __init__(self, binary: str, model: str, speculative: bool, width: int) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        # The log lives as long as the server (closed in close()).
        self.log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log")  # noqa: SIM115
        args = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["-np", str(width), "-t", str(os.cpu_count() or 2), "-c", str(4096 * width)]
        # Waiting threads sleep instead of polling: on a shared machine a polling thread holds
        # the core its team's late thread needs (the same reason met's barrier yields).
        args += ["--poll", "0"]
        args += SPEC_ARGS if speculative else ["--spec-type", "none"]
        env = dict(os.environ, LD_LIBRARY_PATH=str(Path(binary).parent))
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited: {Path(self.log.name).read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("llama-server did not become ready")

    def complete(self, ids: list[int], max_tokens: int) -> PeerRequest:
        body = {
            "prompt": ids,
            "n_predict": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "cache_prompt": False,
            "return_tokens": True,
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        out = PeerRequest()
        with urllib.request.urlopen(req, timeout=600) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("tokens"):
                    now = time.perf_counter()
                    out.first = now if out.first is None else out.first
                    out.tokens.extend(chunk["tokens"])
                    out.last = now
                timings = chunk.get("timings") or {}
                out.drafted = timings.get("draft_n", out.drafted)
                out.accepted = timings.get("draft_n_accepted", out.accepted)
        return out

    def run(self, batch: list[list[int]], max_tokens: int, width: int) -> list[PeerRequest]:
        with ThreadPoolExecutor(width) as pool:
            return list(pool.map(lambda ids: self.complete(ids, max_tokens), batch))

    def log_offset(self) -> int:
        self.log.flush()
        return len(Path(self.log.name).read_text())

    def drafts_since(self, since: int) -> float:
        """Drafts made since log offset `since`, from llama-server's `mean len` per request
        (accepted draft tokens per draft, plus one for the target's own token)."""
        text = Path(self.log.name).read_text()
        drafts = 0.0
        for acc, gen, mean_len in _MEAN_LEN.findall(text[since:]):
            # A request with nothing accepted says mean len 1.00: its drafts are m tokens each.
            drafts += int(acc) / (float(mean_len) - 1.0) if int(acc) else int(gen) / DRAFT_M
        return drafts

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
