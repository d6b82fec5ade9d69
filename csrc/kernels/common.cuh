// Owns: the device helpers every kernel file shares: loads/stores of the three storage types
// as float, warp and block reductions, launch checking and the DType dispatch.
// Called by: the .cu files of csrc/kernels only.
// Invariants: arithmetic is float32 whatever the storage type; vector helpers read 8 elements
// at an address aligned to 8 elements (callers check head_dim % 8 == 0 and base alignment).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels.h"

namespace met::kernels {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Eight consecutive elements as floats: one 16-byte load for 16-bit types, two for float.
template <typename T>
__device__ __forceinline__ void load8(const T* src, float* dst) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = reinterpret_cast<const float4*>(src)[0];
    const float4 b = reinterpret_cast<const float4*>(src)[1];
    dst[0] = a.x, dst[1] = a.y, dst[2] = a.z, dst[3] = a.w;
    dst[4] = b.x, dst[5] = b.y, dst[6] = b.z, dst[7] = b.w;
  } else {
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) dst[i] = to_float(h[i]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (max) over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `scratch` holds 32 floats; the call ends with the block synchronized.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

inline void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

inline void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(what);
}

// Calls f with a null pointer of the storage type: f(static_cast<T*>(nullptr)).
template <typename F>
void dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(static_cast<float*>(nullptr));
      return;
    case DType::kF16:
      f(static_cast<__half*>(nullptr));
      return;
    case DType::kBF16:
      f(static_cast<__nv_bfloat16*>(nullptr));
      return;
  }
  throw std::invalid_argument("unknown dtype");
}

}  // namespace met::kernels
