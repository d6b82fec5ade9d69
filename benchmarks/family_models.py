"""Scaled-down models of the 2026 families, written as GGUF files for benchmarks/offline.py (met
beside llama.cpp on the same file): random weights of a realistic layer structure made small
enough for a 2-core machine, built by the tests' own fixtures (tests/python: transformers builds
each model from its config, the fixtures write the file as llama.cpp's converter does).

    PYTHONPATH=python python benchmarks/family_models.py gpt-oss /tmp/gpt-oss-bench.gguf
    PYTHONPATH=python python benchmarks/offline.py --model /tmp/gpt-oss-bench.gguf \
        --variants "met gguf" --long ''

The vocabulary is the fixtures' small BPE one (about a hundred tokens), so the head costs
nothing: the figures compare the decoder layers. Formats: gpt-oss MXFP4 experts and Q8_0
elsewhere (as OpenAI ships it); the others Q8_0. Gemma 4 is its 31B's kind of layers and
E2B's (per-layer embeddings, shared KV); every one runs on met's C++ CPU forward.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from gguf_writing import Q  # noqa: E402

# Per family: the transformers config overrides of the scaled-down model (hidden 512, 8 layers).
SHAPES = {
    "gpt-oss": {
        "hidden_size": 512,
        "intermediate_size": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 4096,
        "num_local_experts": 16,
        "num_experts_per_tok": 4,
        "sliding_window": 128,
    },
    "qwen35moe": {
        "hidden_size": 512,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 4096,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 256,
        "shared_expert_intermediate_size": 512,
    },
    # The 31B's kind of layers (the C++ CPU forward's): five sliding to each global one, the
    # global ones twice as wide with V from K; no shared-KV layers (the 31B has none).
    "gemma4": {
        "num_kv_shared_layers": 0,
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "global_head_dim": 128,
        "sliding_window": 512,
        "max_position_embeddings": 4096,
    },
    # E2B's kind: four sliding to each global layer, per-layer embeddings, the last layers
    # attending over earlier layers' KV (E2B: 20 of 35; the layers before them end with a
    # global one, as llama.cpp's loader assumes).
    "gemma4-e2b": {
        "num_kv_shared_layers": 5,
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 10,
        "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "global_head_dim": 128,
        "sliding_window": 512,
        "max_position_embeddings": 4096,
        "hidden_size_per_layer_input": 64,
    },
}


def write(family: str, path: Path) -> Path:
    shape = SHAPES[family]
    if family == "gpt-oss":
        from gpt_oss_fixtures import gpt_oss_gguf, gpt_oss_model

        model = gpt_oss_model(truncate=True, **shape)
        return gpt_oss_gguf(model, path, Q.MXFP4, Q.Q8_0)
    if family.startswith("gemma4"):
        from gemma4_fixtures import LIKE_31B, gemma4, write_gemma4_gguf

        model = gemma4(**({**LIKE_31B, **shape} if family == "gemma4" else shape))
        return write_gemma4_gguf(model, path, Q.Q8_0, overrides=shape)
    import hybrid_fixtures

    return hybrid_fixtures.write_gguf(hybrid_fixtures.build(family, **shape), path, family, Q.Q8_0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=sorted(SHAPES))
    parser.add_argument("path", type=Path)
    args = parser.parse_args()
    print(write(args.family, args.path))


if __name__ == "__main__":
    main()
