"""A `met serve` child process owned by the dashboard.

The server runs in its own process rather than a thread so that model compute never holds the
GIL away from the dashboard's event loop, and so that stopping it is the server's own, tested,
SIGTERM drain path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


class ServerProcess:
    def __init__(self, serve_argv: list[str]) -> None:
        self.log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the child
            prefix="met-serve-", suffix=".log", delete=False
        )
        self.log_path = Path(self.log_file.name)
        self._read_offset = 0
        self._partial = ""
        env = dict(os.environ, MET_NO_TUI="1", PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "met.cli", "serve", "--no-tui", *serve_argv],
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            env=env,
            # Its own session: the terminal's Ctrl+C must reach the dashboard, which then stops
            # the server in order, not both at once.
            start_new_session=True,
        )

    def returncode(self) -> int | None:
        return self.process.poll()

    def new_log_lines(self) -> list[str]:
        """Complete lines the server printed since the previous call."""
        with open(self.log_path, encoding="utf-8", errors="replace") as log:
            log.seek(self._read_offset)
            chunk = log.read()
            self._read_offset = log.tell()
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()
        return lines

    def tail(self, count: int = 20) -> list[str]:
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return lines[-count:]

    def stop(self, grace: float = 30.0) -> int:
        """Drain and stop: SIGTERM (the server drains on it), then SIGKILL after `grace`.

        SIGTERM rather than SIGINT: a child inherits an ignored SIGINT from a parent started
        in the background, but never an ignored SIGTERM.
        """
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            if self.process.poll() is not None:
                break
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        self.log_file.close()
        return self.process.returncode if self.process.returncode is not None else 1

    def cleanup(self) -> None:
        self.log_path.unlink(missing_ok=True)
