"""Tensor parallelism over torch.distributed: launch (dist), weight slices (shard), the wire
format (protocol), rank 0's backend (tp_backend) and the other ranks' loop (worker)."""
