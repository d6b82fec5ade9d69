"""The backend's streams and event on a GPU: C++-owned handles that torch runs its work on.

met._core.cuda.StreamSet creates the decode stream (trace id 0), the prefill stream (id 1) and
the event (id 2); this wraps each stream in torch.cuda.ExternalStream so `with
streams.use(stream_id):` puts torch's matmuls and met's kernels on the same queue. Prefill and
decode are then ordered only by record_event / stream_wait_event, exactly the calls the
scheduler issues.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from met import _core


class CudaStreams:
    """One per backend (per GPU); ids are the trace's, so backend calls pass straight through."""

    def __init__(self, device: int = 0) -> None:
        if not _core.has_cuda():
            raise RuntimeError("met._core was built without CUDA")
        self._set = _core.cuda.StreamSet(device)
        self.device = torch.device("cuda", device)
        self._torch = {
            sid: torch.cuda.ExternalStream(self._set.stream_handle(sid), device=self.device)
            for sid in (_core.cuda.StreamSet.DECODE, _core.cuda.StreamSet.PREFILL)
        }

    # The backend methods of the same names forward here.
    def create_stream(self) -> int:
        return self._set.create_stream()

    def create_event(self) -> int:
        return self._set.create_event()

    def record_event(self, event: int, stream: int) -> None:
        self._set.record_event(event, stream)

    def stream_wait_event(self, stream: int, event: int) -> None:
        self._set.stream_wait_event(stream, event)

    def synchronize(self, stream: int) -> None:
        self._set.synchronize(stream)

    def torch_stream(self, stream: int) -> torch.cuda.ExternalStream:
        return self._torch[stream]

    def use(self, stream: int) -> AbstractContextManager:
        """Makes the trace stream `stream` torch's current stream for the block."""
        return torch.cuda.stream(self._torch[stream])
