"""Engine configuration (the server and CLI layer their own options on top, read in one place)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    # GGUF file, Hugging Face folder or user/repo[:QUANT] on the Hub; None: the default model
    model: str | None = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    # auto | dequantized | gguf (met.models.WEIGHT_FORMATS). auto keeps a GGUF file's quantized
    # weights as blocks on the CPU (run by the C++ forward) unless a dtype is asked for.
    weight_format: str = "auto"
    device: str = "auto"  # auto | cpu | cuda
    # None: 8 on the CPU (a bigger batch there buys little throughput for much longer steps),
    # 64 on a GPU; resolved in place when the engine starts, so whoever shares this config
    # (the async engine, the dashboard) reads the value in use.
    max_num_seqs: int | None = None
    max_prefill_tokens: int = 512  # chunk length of chunked prefill; 0: whole prompts
    max_batch_tokens: int = 8192
    max_model_len: int | None = None  # default: the model's context length
    kv_cache_blocks: int | None = None  # default: enough for max_num_seqs full contexts
    # GPU: the share of the device's memory met may use (weights, KV pool, activations); the KV
    # pool gets what is left, up to max_num_seqs full contexts (met.engine.kv_budget).
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    enable_prefix_cache: bool = True
    # A hybrid model's prefix cache keeps this many recurrent-state checkpoints, each one
    # sequence's state (met.engine.hybrid); None: max_num_seqs.
    state_checkpoints: int | None = None
    max_queue: int = 256
    tensor_parallel_size: int = 1  # ranks each holding 1/N of every layer (met.parallel)
    # With tensor_parallel_size N > 1: a MoE's experts are split over the N ranks, E/N whole
    # experts each, instead of 1/N of every expert (met.parallel.experts).
    enable_expert_parallel: bool = False
    enforce_eager: bool = False  # GPU: no CUDA graphs, every decode step launched op by op
    # auto | float16 | bfloat16 | float32 (met.engine.kv_budget.kv_dtype): auto is float16 for
    # the C++ CPU forward (half the memory, as llama.cpp), the model's dtype otherwise.
    kv_cache_dtype: str = "auto"
    # Prompt-lookup speculative decoding (docs/speculative.md): ngram (the gate runs it per batch
    # width where it measures a gain, the planner drafts what pays; the default since the full
    # benchmark run showed it within the noise of off where it cannot win, benchmarks/README.md)
    # | ngram-forced (always, for measurement) | off.
    speculative: str = "ngram"
    num_speculative_tokens: int = 4  # draft tokens per verify row at most
    # Embeddings and rerank (met.engine.pooling): None takes the pooling the model file names
    # (an embedding model's); mean | cls | last | rank ask for it on any model, none refuses.
    pooling: str | None = None
