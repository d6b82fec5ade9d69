// Paged attention for decode and for variable-length prefill / mixed rows (kernels.h).
//
// One CTA takes 16 query-head rows of one batch row that share a KV head (grouped-query
// attention: the G query heads of a KV head read each K/V tile once) and a range of key
// positions. K/V tiles of 32 keys are gathered through the block table into shared memory; in
// each warp lane j scores key j against the warp's 4 rows, an online softmax keeps running
// max/sum per row, and lanes then own output dimensions for the P.V accumulation. Decode rows
// (one query) split their context over several CTAs when the batch alone cannot fill the GPU;
// a second kernel merges those partial results.
#include <cstdint>

#include "common.cuh"

namespace met::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerCta = kWarps * kRowsPerWarp;
constexpr int kTileKeys = 32;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxDimsPerLane = kMaxHeadDim / 32;
// Enough CTAs to fill an H200 (132 SMs) about twice; decides how far decode rows are split.
constexpr int kTargetCtas = 264;
constexpr int kMinSplitKeys = 128;
constexpr float kLog2e = 1.4426950408889634f;

struct Split {
  int parts = 1;
  int part_len = 0;  // key positions per part, a multiple of kTileKeys
  int q_tiles = 1;
};

Split split_for(const AttentionArgs& a) {
  const int groups = a.n_heads / a.kv.n_kv_heads;
  Split s;
  s.q_tiles = (a.max_query_len * groups + kRowsPerCta - 1) / kRowsPerCta;
  const int max_len = a.max_seq_len > 0 ? a.max_seq_len : 1;
  if (a.max_query_len == 1) {
    // Prefill already has a CTA per 16 query rows; only decode needs its keys split.
    const long ctas = static_cast<long>(s.q_tiles) * a.batch * a.kv.n_kv_heads;
    const long want = (kTargetCtas + ctas - 1) / ctas;
    const long most = (max_len + kMinSplitKeys - 1) / kMinSplitKeys;
    s.parts = static_cast<int>(want < most ? want : most);
    if (s.parts < 1) s.parts = 1;
  }
  const int per_part = (max_len + s.parts - 1) / s.parts;
  s.part_len = (per_part + kTileKeys - 1) / kTileKeys * kTileKeys;
  s.parts = (max_len + s.part_len - 1) / s.part_len;
  return s;
}

size_t smem_floats(int head_dim) {
  return static_cast<size_t>(kRowsPerCta) * head_dim + kTileKeys * (head_dim + 4) +
         kTileKeys * head_dim + kWarps * kRowsPerWarp * kTileKeys;
}

struct Params {
  AttentionArgs a;
  int parts;
  int part_len;
  int groups;
};

template <typename T>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(Params p) {
  const AttentionArgs& a = p.a;
  const int dim = a.kv.head_dim, n_kv = a.kv.n_kv_heads, bs = a.kv.block_size;
  const int part = blockIdx.x % p.parts, q_tile = blockIdx.x / p.parts;
  const int b = blockIdx.y, kv_head = blockIdx.z;
  const int q_begin = a.cu_seqlens[b], q_len = a.cu_seqlens[b + 1] - q_begin;
  const int ctx = a.seq_lens[b];
  const int row0 = q_tile * kRowsPerCta;
  const int n_rows = min(q_len * p.groups - row0, kRowsPerCta);
  if (n_rows <= 0) return;  // this tile owns no query of row b

  extern __shared__ float smem[];
  float* q_s = smem;                         // [kRowsPerCta][dim], pre-scaled
  float* k_s = q_s + kRowsPerCta * dim;      // [kTileKeys][dim + 4]: padded, no conflicts
  float* v_s = k_s + kTileKeys * (dim + 4);  // [kTileKeys][dim]
  float* p_s = v_s + kTileKeys * dim;        // [kWarps][kRowsPerWarp][kTileKeys]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T* q = static_cast<const T*>(a.q);
  const T* k_cache = static_cast<const T*>(a.k_cache);
  const T* v_cache = static_cast<const T*>(a.v_cache);
  const int64_t q_stride = a.q_row_stride ? a.q_row_stride : int64_t{a.n_heads} * dim;
  const int vecs = dim / 8;

  // Rows are query-major: row r is query r / G, head kv_head * G + r % G.
  const float q_scale = a.scale * kLog2e;  // scores in log2 units: exp2f in the softmax
  for (int idx = threadIdx.x; idx < kRowsPerCta * vecs; idx += blockDim.x) {
    const int r = idx / vecs, c = (idx % vecs) * 8;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (r < n_rows) {
      const int row = row0 + r, query = row / p.groups;
      const int head = kv_head * p.groups + row % p.groups;
      load8(q + (q_begin + query) * q_stride + int64_t{head} * dim + c, v);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) q_s[r * dim + c + i] = v[i] * q_scale;
  }

  // Keys a row may see: positions [0, ctx - q_len + query]; the tile's last row sees the most.
  const int tile_limit = ctx - q_len + (row0 + n_rows - 1) / p.groups + 1;
  const int k_begin = part * p.part_len;
  const int k_end = min(k_begin + p.part_len, tile_limit);

  int limit[kRowsPerWarp];
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kMaxDimsPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    limit[rr] = r < n_rows ? ctx - q_len + (row0 + r) / p.groups + 1 : 0;
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxDimsPerLane; ++e) acc[rr][e] = 0.0f;
  }

  for (int kt = k_begin; kt < k_end; kt += kTileKeys) {
    const int n_keys = min(kTileKeys, k_end - kt);
    __syncthreads();  // the previous tile is fully consumed (and q_s is written, first time)
    for (int idx = threadIdx.x; idx < kTileKeys * vecs; idx += blockDim.x) {
      const int j = idx / vecs, c = (idx % vecs) * 8;
      float kv[8] = {0, 0, 0, 0, 0, 0, 0, 0}, vv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (j < n_keys) {
        const int pos = kt + j;
        const int64_t block = a.block_tables[int64_t{b} * a.max_blocks + pos / bs];
        const int64_t off = ((block * bs + pos % bs) * n_kv + kv_head) * dim + c;
        load8(k_cache + off, kv);
        load8(v_cache + off, vv);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        k_s[j * (dim + 4) + c + i] = kv[i];
        v_s[j * dim + c + i] = vv[i];
      }
    }
    __syncthreads();
    if (warp * kRowsPerWarp >= n_rows) continue;  // no row of this warp; keep the barriers

    float s[kRowsPerWarp] = {0, 0, 0, 0};
    const float* krow = k_s + lane * (dim + 4);
    for (int d = 0; d < dim; d += 4) {
      const float4 k4 = *reinterpret_cast<const float4*>(krow + d);
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float4 q4 =
            *reinterpret_cast<const float4*>(q_s + (warp * kRowsPerWarp + rr) * dim + d);
        s[rr] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
      }
    }
    float* p_warp = p_s + warp * kRowsPerWarp * kTileKeys;
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const bool visible = lane < n_keys && kt + lane < limit[rr];
      const float score = visible ? s[rr] : -INFINITY;
      const float m_new = fmaxf(m[rr], warp_max(score));
      // A row that has seen no key yet keeps m = -inf; never form exp2(-inf - -inf).
      const float alpha = m_new == -INFINITY ? 1.0f : exp2f(m[rr] - m_new);
      const float prob = m_new == -INFINITY ? 0.0f : exp2f(score - m_new);
      m[rr] = m_new;
      l[rr] = l[rr] * alpha + prob;  // per-lane partial sum, reduced once at the end
#pragma unroll
      for (int e = 0; e < kMaxDimsPerLane; ++e) acc[rr][e] *= alpha;
      p_warp[rr * kTileKeys + lane] = prob;
    }
    __syncwarp();
    for (int j = 0; j < n_keys; ++j) {
      float vj[kMaxDimsPerLane];
#pragma unroll
      for (int e = 0; e < kMaxDimsPerLane; ++e) {
        const int d = lane + 32 * e;
        vj[e] = d < dim ? v_s[j * dim + d] : 0.0f;
      }
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float pj = p_warp[rr * kTileKeys + j];
#pragma unroll
        for (int e = 0; e < kMaxDimsPerLane; ++e) acc[rr][e] += pj * vj[e];
      }
    }
  }

  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    const float total = warp_sum(l[rr]);
    if (r >= n_rows) continue;
    const int row = row0 + r, query = row / p.groups;
    const int head = kv_head * p.groups + row % p.groups;
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;  // no visible key: zeros
    if (p.parts == 1) {
      T* dst = out + (int64_t{q_begin + query} * a.n_heads + head) * dim;
#pragma unroll
      for (int e = 0; e < kMaxDimsPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < dim) dst[d] = from_float<T>(acc[rr][e] * inv);
      }
    } else {
      // Decode only (one query per row): partials indexed by (batch row, head, part).
      const int64_t slot = (int64_t{b} * a.n_heads + head) * p.parts + part;
      const int64_t n_slots = int64_t{a.batch} * a.n_heads * p.parts;
      float* ws_acc = a.workspace + slot * dim;
#pragma unroll
      for (int e = 0; e < kMaxDimsPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < dim) ws_acc[d] = acc[rr][e] * inv;
      }
      if (lane == 0) {
        a.workspace[n_slots * dim + slot] = m[rr];
        a.workspace[n_slots * (dim + 1) + slot] = total;
      }
    }
  }
}

// Merges the parts of each decode row: weights l_p * 2^(m_p - max m), a normalised sum.
template <typename T>
__global__ void combine_kernel(Params p) {
  const AttentionArgs& a = p.a;
  const int head = blockIdx.x, b = blockIdx.y, dim = a.kv.head_dim;
  if (a.cu_seqlens[b + 1] == a.cu_seqlens[b]) return;
  const int64_t first = (int64_t{b} * a.n_heads + head) * p.parts;
  const int64_t n_slots = int64_t{a.batch} * a.n_heads * p.parts;
  const float* ws_m = a.workspace + n_slots * dim;
  const float* ws_l = a.workspace + n_slots * (dim + 1);
  float top = -INFINITY;
  for (int i = 0; i < p.parts; ++i) top = fmaxf(top, ws_m[first + i]);
  T* dst = static_cast<T*>(a.out) + (int64_t{a.cu_seqlens[b]} * a.n_heads + head) * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    for (int i = 0; i < p.parts; ++i) {
      const float mi = ws_m[first + i];
      if (mi == -INFINITY) continue;  // an empty part (past the row's context)
      const float w = ws_l[first + i] * exp2f(mi - top);
      num += w * a.workspace[(first + i) * dim + d];
      den += w;
    }
    dst[d] = from_float<T>(den > 0.0f ? num / den : 0.0f);
  }
}

void validate(const AttentionArgs& a) {
  require(a.kv.n_kv_heads > 0 && a.n_heads % a.kv.n_kv_heads == 0,
          "paged_attention: n_heads must be a positive multiple of n_kv_heads");
  require(a.kv.head_dim > 0 && a.kv.head_dim % 8 == 0 && a.kv.head_dim <= kMaxHeadDim,
          "paged_attention: head_dim must be a multiple of 8, at most 256");
  require(a.kv.block_size > 0 && a.max_blocks > 0, "paged_attention: empty block table");
  require(a.max_query_len >= 1 && a.max_seq_len >= a.max_query_len,
          "paged_attention: need 1 <= max_query_len <= max_seq_len");
  require(a.q_row_stride == 0 || a.q_row_stride % 8 == 0,
          "paged_attention: q_row_stride must be a multiple of 8");
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  require(aligned(a.q) && aligned(a.out) && aligned(a.k_cache) && aligned(a.v_cache),
          "paged_attention: q, out and the caches must be 16-byte aligned");
}

}  // namespace

size_t attention_workspace_floats(const AttentionArgs& a) {
  if (a.batch <= 0) return 0;
  validate(a);
  const Split s = split_for(a);
  if (s.parts == 1) return 0;
  return static_cast<size_t>(a.batch) * a.n_heads * s.parts * (a.kv.head_dim + 2);
}

void paged_attention(const AttentionArgs& a, cudaStream_t stream) {
  if (a.batch <= 0) return;
  validate(a);
  const Split s = split_for(a);
  require(s.parts == 1 || a.workspace != nullptr, "paged_attention: workspace missing");
  const Params p{a, s.parts, s.part_len, a.n_heads / a.kv.n_kv_heads};
  const size_t smem = smem_floats(a.kv.head_dim) * sizeof(float);
  const dim3 grid(s.q_tiles * s.parts, a.batch, a.kv.n_kv_heads);
  dispatch(a.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (smem > 48 * 1024) {
      // head_dim > 144 needs more than the default 48 KiB of dynamic shared memory.
      cudaFuncSetAttribute(attention_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
    }
    attention_kernel<T><<<grid, kWarps * 32, smem, stream>>>(p);
    check_launch("paged_attention");
    if (s.parts > 1) {
      combine_kernel<T><<<dim3(a.n_heads, a.batch), 128, 0, stream>>>(p);
      check_launch("paged_attention combine");
    }
  });
}

}  // namespace met::kernels
