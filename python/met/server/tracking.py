"""What /status shows: requests in flight, the last finished ones, and the last log lines."""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass


@dataclass
class RequestRecord:
    id: str
    prompt_tokens: int
    arrived: float  # time.monotonic()
    state: str = "waiting"  # waiting | running | a finish reason | error | disconnected
    generated_tokens: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None

    def view(self, now: float) -> dict:
        end = self.finished_at or now
        decode_s = end - self.first_token_at if self.first_token_at is not None else 0.0
        return {
            "id": self.id,
            "state": self.state,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "tokens_per_s": round(self.generated_tokens / decode_s, 2) if decode_s > 0 else 0.0,
            "age_s": round(end - self.arrived, 3),
        }


class RequestTracker:
    def __init__(self, keep_finished: int = 50) -> None:
        self.active: dict[str, RequestRecord] = {}
        self.finished: collections.deque[RequestRecord] = collections.deque(maxlen=keep_finished)

    def start(self, record: RequestRecord) -> None:
        self.active[record.id] = record

    def finish(self, record: RequestRecord, state: str) -> None:
        record.state = state
        record.finished_at = time.monotonic()
        if self.active.pop(record.id, None) is not None:
            self.finished.append(record)

    def view(self) -> list[dict]:
        now = time.monotonic()
        records = [*self.active.values(), *reversed(self.finished)]
        return [r.view(now) for r in records]


class RecentLogs(logging.Handler):
    """Keeps the last formatted log lines in memory for the dashboard."""

    def __init__(self, keep: int = 200) -> None:
        super().__init__()
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:  # a broken log record must not break the request it describes
            self.handleError(record)
