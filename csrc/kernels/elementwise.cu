// KV append, RMSNorm, RoPE and SiLU-and-multiply (kernels.h): the per-token kernels of a
// decoder layer around its matmuls. Each is memory-bound, so each reads and writes every
// element once; only RMSNorm needs a reduction (one CTA per token row).
#include <cstdint>
#include <initializer_list>

#include "common.cuh"

namespace met::kernels {
namespace {

// One thread per 8 elements (head_dim % 8 == 0): 16-byte loads for the 16-bit types.
template <typename T>
__global__ void kv_append_kernel(T* k_cache, T* v_cache, const T* k, const T* v,
                                 const int64_t* slots, int32_t n_tokens, int64_t src_stride,
                                 int32_t row_elems) {
  const int vecs = row_elems / 8;
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (idx >= int64_t{n_tokens} * vecs) return;
  const int64_t t = idx / vecs, c = (idx % vecs) * 8;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const int64_t dst = slot * row_elems + c, src = t * src_stride + c;
  if constexpr (sizeof(T) == 4) {
    reinterpret_cast<float4*>(k_cache + dst)[0] = reinterpret_cast<const float4*>(k + src)[0];
    reinterpret_cast<float4*>(k_cache + dst)[1] = reinterpret_cast<const float4*>(k + src)[1];
    reinterpret_cast<float4*>(v_cache + dst)[0] = reinterpret_cast<const float4*>(v + src)[0];
    reinterpret_cast<float4*>(v_cache + dst)[1] = reinterpret_cast<const float4*>(v + src)[1];
  } else {
    *reinterpret_cast<uint4*>(k_cache + dst) = *reinterpret_cast<const uint4*>(k + src);
    *reinterpret_cast<uint4*>(v_cache + dst) = *reinterpret_cast<const uint4*>(v + src);
  }
}

template <typename T>
__global__ void rms_norm_kernel(T* out, const T* x, const T* weight, int32_t hidden, float eps) {
  __shared__ float scratch[32];
  const T* row = x + int64_t{blockIdx.x} * hidden;
  float sq = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = to_float(row[i]);
    sq += v * v;
  }
  const float inv = rsqrtf(block_sum(sq, scratch) / hidden + eps);
  T* dst = out + int64_t{blockIdx.x} * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    // One rounding at the end, as torch's rms_norm (it upcasts the input and the weight).
    dst[i] = from_float<T>(to_float(row[i]) * inv * to_float(weight[i]));
  }
}

// One thread per rotated pair (x[i], x[i + half]) of one head of one token.
template <typename T>
__global__ void rope_kernel(T* x, const int64_t* positions, const float* cos, const float* sin,
                            int32_t n_tokens, int32_t n_heads, int32_t half, int64_t row_stride) {
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (idx >= int64_t{n_tokens} * n_heads * half) return;
  const int i = idx % half;
  const int64_t head = (idx / half) % n_heads, t = idx / (int64_t{half} * n_heads);
  const int64_t pos = positions[t];
  const float c = cos[pos * half + i], s = sin[pos * half + i];
  T* h = x + t * row_stride + head * 2 * half;
  const float x1 = to_float(h[i]), x2 = to_float(h[i + half]);
  h[i] = from_float<T>(x1 * c - x2 * s);
  h[i + half] = from_float<T>(x2 * c + x1 * s);
}

template <typename T>
__global__ void silu_mul_kernel(T* out, const T* x, int32_t n_tokens, int32_t ffn) {
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (idx >= int64_t{n_tokens} * ffn) return;
  const int64_t t = idx / ffn, i = idx % ffn;
  const float gate = to_float(x[t * 2 * ffn + i]), up = to_float(x[t * 2 * ffn + ffn + i]);
  // torch rounds silu(gate) to the storage type before the product; so does this.
  const float act = to_float(from_float<T>(gate / (1.0f + __expf(-gate))));
  out[idx] = from_float<T>(act * up);
}

unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace

void kv_append(void* k_cache, void* v_cache, const void* k, const void* v,
               const int64_t* slot_mapping, int32_t n_tokens, int64_t src_row_stride,
               const KvLayout& kv, DType dtype, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  const int32_t row = kv.n_kv_heads * kv.head_dim;
  require(kv.head_dim % 8 == 0 && src_row_stride % 8 == 0,
          "kv_append: head_dim and the source row stride must be multiples of 8");
  require(src_row_stride >= row, "kv_append: source rows overlap");
  for (const void* ptr : std::initializer_list<const void*>{k_cache, v_cache, k, v}) {
    require(reinterpret_cast<uintptr_t>(ptr) % 16 == 0,
            "kv_append: pointers must be 16-byte aligned");
  }
  const int64_t n = int64_t{n_tokens} * (row / 8);
  dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    kv_append_kernel<T><<<blocks_for(n, 256), 256, 0, stream>>>(
        static_cast<T*>(k_cache), static_cast<T*>(v_cache), static_cast<const T*>(k),
        static_cast<const T*>(v), slot_mapping, n_tokens, src_row_stride, row);
  });
  check_launch("kv_append");
}

void rms_norm(void* out, const void* x, const void* weight, int32_t n_tokens, int32_t hidden,
              float eps, DType dtype, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  require(hidden > 0, "rms_norm: hidden must be positive");
  const int threads = hidden >= 1024 ? 1024 : (hidden + 31) / 32 * 32;
  dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rms_norm_kernel<T><<<n_tokens, threads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(x), static_cast<const T*>(weight), hidden, eps);
  });
  check_launch("rms_norm");
}

void rope(void* x, const int64_t* positions, const float* cos, const float* sin, int32_t n_tokens,
          int32_t n_heads, int32_t head_dim, int64_t row_stride, DType dtype, cudaStream_t stream) {
  if (n_tokens <= 0 || n_heads <= 0) return;
  require(head_dim > 0 && head_dim % 2 == 0, "rope: head_dim must be even");
  require(row_stride >= int64_t{n_heads} * head_dim, "rope: rows overlap");
  const int64_t n = int64_t{n_tokens} * n_heads * (head_dim / 2);
  dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rope_kernel<T><<<blocks_for(n, 256), 256, 0, stream>>>(
        static_cast<T*>(x), positions, cos, sin, n_tokens, n_heads, head_dim / 2, row_stride);
  });
  check_launch("rope");
}

void silu_mul(void* out, const void* x, int32_t n_tokens, int32_t ffn, DType dtype,
              cudaStream_t stream) {
  if (n_tokens <= 0) return;
  require(ffn > 0, "silu_mul: ffn must be positive");
  const int64_t n = int64_t{n_tokens} * ffn;
  dispatch(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    silu_mul_kernel<T><<<blocks_for(n, 256), 256, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(x), n_tokens, ffn);
  });
  check_launch("silu_mul");
}

}  // namespace met::kernels
