// Owns: plain C++ CPU references of every CUDA kernel in csrc/kernels (same layouts and
// semantics as kernels.h, host arrays instead of device pointers).
// Called by: tests/cpp/test_kernel_refs.cc; bindings/cuda.cpp exposes sample_ref so the GPU
// test can compare the sampling kernel draw for draw.
// Invariants: values are float32 holding numbers representable in `dtype` (the caller rounds
// inputs with round_to); a result is rounded to `dtype` exactly where the kernel stores it.
// No CUDA headers: this builds and is tested on machines without the toolkit.
#pragma once

#include <cstdint>
#include <vector>

#include "../kernel_types.h"

namespace met::kernels::ref {

// Round-to-nearest-even to the storage type (identity for kF32).
float round_to(float x, DType dtype);

struct Attention {
  const float* q = nullptr;  // [T, n_heads, head_dim], rows q_row_stride apart (0: packed)
  const float* k_cache = nullptr;
  const float* v_cache = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* seq_lens = nullptr;
  const int32_t* cu_seqlens = nullptr;
  int32_t batch = 0;
  int32_t max_blocks = 0;
  int32_t n_heads = 0;
  int64_t q_row_stride = 0;
  float scale = 0.0f;
  KvLayout kv;
  DType dtype = DType::kF32;
};
// Returns [T, n_heads, head_dim], T = cu_seqlens[batch].
std::vector<float> paged_attention(const Attention& a);

void kv_append(float* k_cache, float* v_cache, const float* k, const float* v,
               const int64_t* slot_mapping, int32_t n_tokens, int64_t src_row_stride,
               const KvLayout& kv);

void rms_norm(float* out, const float* x, const float* weight, int32_t n_tokens, int32_t hidden,
              float eps, DType dtype);

void rope(float* x, const int64_t* positions, const float* cos, const float* sin, int32_t n_tokens,
          int32_t n_heads, int32_t head_dim, int64_t row_stride, DType dtype);

void silu_mul(float* out, const float* x, int32_t n_tokens, int32_t ffn, DType dtype);

int32_t argmax(const float* logits, int32_t vocab);

struct SampleParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  uint64_t step = 0;
};
// One row of kernels::sample, written the plain way: sort, cut, draw.
int32_t sample(const float* logits, int32_t vocab, const SampleParams& p);

}  // namespace met::kernels::ref
