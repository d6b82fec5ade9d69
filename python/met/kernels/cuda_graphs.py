"""Decode forwards captured as CUDA graphs, one per batch size, replayed over stable buffers.

The graphs live on the Python side (torch.cuda.CUDAGraph), not in C++: torch's caching allocator
must see a capture to give it a private memory pool, and only torch.cuda.graph arranges that.
C++ owns the stream the graphs are captured and replayed on (cuda_streams.CudaStreams).

A batch of n rows runs the graph of the smallest captured size >= n: its inputs are copied into
the first n rows of the graph's buffers and the other rows are set to each input's pad value
(for met's decode: slot -1 so kv_append skips the row, seq_len 0 so attention writes zeros).

`capture=False` keeps the buckets and the padding but runs the forward eagerly on the padded
buffers at each call: the same inputs a replay would see, on any device (the CPU tests check
met's padding contract this way; a GPU run with --enforce-eager does not come here at all).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


class DecodeGraphs:
    """`forward(buffers) -> Tensor` captured at each size; `make_buffers(size)` allocates the
    stable inputs (every per-row input has the batch as its first dimension; buffers not named in
    `pad` are constants the forward reads, such as cu_seqlens)."""

    def __init__(
        self,
        forward: Callable[[dict[str, Tensor]], Tensor],
        make_buffers: Callable[[int], dict[str, Tensor]],
        pad: dict[str, int | float],
        batch_sizes: Iterable[int] = DEFAULT_BATCH_SIZES,
        stream: torch.cuda.Stream | None = None,
        warmup: int = 2,
        capture: bool = True,
    ) -> None:
        self._forward = forward
        self._pad = dict(pad)
        self._stream = stream
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph | None, dict[str, Tensor], Tensor]] = {}
        self._pool = None
        # Largest first: smaller graphs then fit in the memory the first one pooled.
        for size in sorted(set(batch_sizes), reverse=True):
            if capture:
                self._capture(size, make_buffers(size), warmup)
            else:
                self._graphs[size] = (None, make_buffers(size), None)

    def _capture(self, size: int, buffers: dict[str, Tensor], warmup: int) -> None:
        stream = self._stream if self._stream is not None else torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):  # lazy initialisation (cuBLAS handles, workspaces) first
                self._forward(buffers)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=stream):
            out = self._forward(buffers)
        self._pool = graph.pool()
        self._graphs[size] = (graph, buffers, out)

    @property
    def batch_sizes(self) -> list[int]:
        return sorted(self._graphs)

    def size_for(self, n: int) -> int | None:
        """The captured size that runs n rows, or None when n exceeds every size (run eagerly)."""
        return next((s for s in self.batch_sizes if s >= n), None)

    def run(self, inputs: dict[str, Tensor]) -> Tensor:
        """Replays the graph for len(rows) on the current stream; returns its first n rows.

        The returned tensor is the graph's own output buffer: read or copy it before the next
        replay of the same size.
        """
        n = next(iter(inputs.values())).shape[0]
        size = self.size_for(n)
        if size is None:
            raise ValueError(f"{n} rows exceed the largest captured batch {self.batch_sizes[-1]}")
        graph, buffers, out = self._graphs[size]
        for name, value in inputs.items():
            buf = buffers[name]
            buf[:n].copy_(value, non_blocking=True)
            if n < size:
                buf[n:].fill_(self._pad[name])
        if graph is None:
            return self._forward(buffers)[:n]
        graph.replay()
        return out[:n]
