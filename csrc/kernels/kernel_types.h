// Owns: the plain values the kernels and their CPU references share (no CUDA headers, so the
// references and their tests build on a machine without the toolkit).
// Called by: kernels.h, reference/kernel_refs.h.
// Invariants: DType values are the integers the Python wrappers pass (cuda_ops.py _DTYPES).
#pragma once

#include <cstdint>

namespace met::kernels {

// Storage type of activations, weights and the KV cache. Arithmetic is always float32.
enum class DType : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// The paged KV layout of python/met/model/llama.py, one layer: [num_blocks, block_size,
// n_kv_heads, head_dim]; K and V are separate arrays of that shape.
struct KvLayout {
  int32_t block_size = 16;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;  // a multiple of 8, at most 256
};

}  // namespace met::kernels
