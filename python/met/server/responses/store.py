"""The responses kept for `store: true`: bounded by count and age, LRU out first."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from met.chat.types import ChatMessage

MAX_RESPONSES = 1024
MAX_AGE_S = 3600.0


@dataclass
class Stored:
    response: dict[str, Any]  # the response object as it was returned
    conversation: list[ChatMessage]  # input and output as messages, for previous_response_id
    stored_at: float


class ResponseStore:
    def __init__(
        self,
        max_responses: int = MAX_RESPONSES,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_responses = max_responses
        self.max_age_s = max_age_s
        self._clock = clock
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._items)

    def put(self, response: dict[str, Any], conversation: list[ChatMessage]) -> None:
        self._expire()
        self._items[response["id"]] = Stored(response, conversation, self._clock())
        self._items.move_to_end(response["id"])
        while len(self._items) > self.max_responses:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> Stored | None:
        self._expire()
        stored = self._items.get(response_id)
        if stored is not None:
            self._items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        self._expire()
        return self._items.pop(response_id, None) is not None

    def _expire(self) -> None:
        # Age counts from when a response was stored; reading it does not make it younger.
        cutoff = self._clock() - self.max_age_s
        for key in [k for k, v in self._items.items() if v.stored_at < cutoff]:
            del self._items[key]
