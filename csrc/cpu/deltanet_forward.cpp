// The CPU model's Gated DeltaNet mixer (LlamaForward::recurrent_block, see llama_forward.h), the
// recurrent layers of Qwen3.5 / Qwen3.6 and Qwen3-Next, as python/met/model/deltanet.py defines
// them: one projection into the q, k, v channels, the output gate z and per value head beta and
// alpha; a causal depthwise conv (kernel taps, SiLU) over the q, k, v channels continuing from
// the slot's last inputs; q and k L2-normalized per key head (q scaled by k_dim^-1/2); the gated
// delta rule per value head (delta_rule.h); RMSNorm(o) * silu(z) per head; the output projection.
//
// Every stage keeps a token's result independent of the rest of the batch: the conv runs each
// channel over each row's own tokens in order, the rule each (row, value head) on its own state,
// and the norms per token, so the forward's batch invariance holds.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpu/delta_rule.h"
#include "cpu/llama_forward.h"
#include "cpu/ops.h"
#include "cpu/quant_matmul_internal.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace met::cpu {

namespace {

constexpr float kL2Eps = 1e-6f;  // transformers' and flash-linear-attention's l2norm epsilon

// The conv's taps a forward takes (Qwen3.5 and Qwen3-Next have 4), and the channels it runs
// side by side: one cache line of each token's inputs.
constexpr int64_t kMaxTaps = 8;
constexpr int64_t kConvLanes = 16;

void fail(const std::string& what) { throw std::invalid_argument("LlamaForward: " + what); }

// Out of line: inlined, GCC merges it with copy_lanes's whole-block copy into one memcpy call
// of a variable size, on every token.
__attribute__((noinline)) void copy_tail(float* out, const float* in, int64_t width) {
  std::copy_n(in, width, out);
}

// width <= kConvLanes floats; a whole block's copy has a constant size, so it stays inline.
inline void copy_lanes(float* out, const float* in, int64_t width) {
  if (width == kConvLanes) {
    std::memcpy(out, in, sizeof(float) * kConvLanes);
  } else {
    copy_tail(out, in, width);
  }
}

// Lanes 0 .. width - 1 of a conv window (a ring whose oldest input is window[oldest]) back into
// the pool's layout: each channel's kept inputs, oldest first.
void store_window(const float (&window)[kMaxTaps][kConvLanes], int64_t oldest, int64_t width,
                  int64_t kept, float* out) {
  for (int64_t l = 0; l < width; ++l) {
    for (int64_t j = 0; j < kept; ++j) out[l * kept + j] = window[(oldest + j) % kept][l];
  }
}

// The four projections of a step's n tokens, each [n, its width], one after the other.
struct Projected {
  float *qkv, *z, *beta, *alpha;
};

Projected projected(std::vector<float>& buffer, int64_t n, const RecurrentDims& r) {
  float* qkv = buffer.data();
  float* z = qkv + n * r.conv_dim();
  float* beta = z + n * r.value_width();
  return Projected{qkv, z, beta, beta + n * r.v_heads};
}

int64_t tokens_of(const ForwardBatch& batch) { return batch.rows.cu_seqlens[batch.rows.n_rows]; }

// x / sqrt(sum(x^2) + eps) * scale in place, the sum in one fixed order (eight partial sums).
void l2_normalize(float* x, int64_t n, float scale) {
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) partial[j] += x[i + j] * x[i + j];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += x[i] * x[i];
  for (int j = 0; j < 8; ++j) sum += partial[j];
  const float inv = 1.0f / std::sqrt(sum + kL2Eps);
  for (int64_t j = 0; j < n; ++j) x[j] = x[j] * inv * scale;
}

int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

}  // namespace

void LlamaForward::check_recurrent(const LayerWeights& l) const {
  const RecurrentDims& r = dims_.recurrent;
  if (r.k_heads <= 0 || r.v_heads <= 0 || r.k_dim <= 0 || r.v_dim <= 0 || r.kernel < 2 ||
      r.kernel > kMaxTaps || r.v_heads % r.k_heads != 0) {
    fail(
        "recurrent layers need positive heads and widths, a kernel of 2 to 8 taps and "
        "value heads a multiple of key heads");
  }
  if (l.attn_norm == nullptr || l.ssm_conv == nullptr || l.ssm_dt == nullptr ||
      l.ssm_a == nullptr || l.ssm_norm == nullptr) {
    fail("a recurrent layer's input norm, conv, dt bias, A or gated norm is null");
  }
  detail::check_weight(l.ssm_qkv, r.conv_dim(), dims_.dim, "ssm_qkv");
  detail::check_weight(l.ssm_z, r.value_width(), dims_.dim, "ssm_z");
  detail::check_weight(l.ssm_beta, r.v_heads, dims_.dim, "ssm_beta");
  detail::check_weight(l.ssm_alpha, r.v_heads, dims_.dim, "ssm_alpha");
  detail::check_weight(l.ssm_out, dims_.dim, r.value_width(), "ssm_out");
}

void LlamaForward::set_recurrent_state(const RecurrentState& state) {
  if (!has_recurrent_) fail("the model has no recurrent layers");
  if (state.conv == nullptr || state.delta == nullptr || state.n_slots <= 0) {
    fail("the recurrent state needs its conv and delta pools and a slot count");
  }
  if ((state.snap_conv == nullptr) != (state.snap_depth == 0) ||
      (state.snap_delta == nullptr) != (state.snap_depth == 0)) {
    fail("snapshots: both pools and a depth, or none");
  }
  if ((state.ckpt_conv == nullptr) != (state.n_checkpoints == 0) ||
      (state.ckpt_delta == nullptr) != (state.n_checkpoints == 0)) {
    fail("checkpoints: both pools and a count, or none");
  }
  state_ = state;
}

// A slot's state in one layer is contiguous in each pool: conv [layers, slots, conv_dim,
// kernel - 1] and delta [layers, slots, v_heads, k_dim, v_dim]; snapshots add the token after the
// slot, checkpoints are [checkpoints, layers, ...] (model/recurrent_state.py).
void LlamaForward::keep_checkpoint(int64_t index, int64_t slot, int64_t token) {
  if (index < 0 || index >= state_.n_checkpoints || slot < 0 || slot >= state_.n_slots ||
      token >= state_.snap_depth) {
    fail("keep_checkpoint: checkpoint " + std::to_string(index) + ", slot " + std::to_string(slot) +
         " or token " + std::to_string(token) + " out of range");
  }
  const RecurrentDims& r = dims_.recurrent;
  const int64_t conv = r.conv_dim() * (r.kernel - 1), delta = r.v_heads * r.k_dim * r.v_dim;
  for (int64_t l = 0; l < n_recurrent_; ++l) {
    const int64_t at = l * state_.n_slots + slot, to = index * n_recurrent_ + l;
    const float* from_conv = state_.conv + at * conv;
    const float* from_delta = state_.delta + at * delta;
    if (token >= 0) {
      from_conv = state_.snap_conv + (at * state_.snap_depth + token) * conv;
      from_delta = state_.snap_delta + (at * state_.snap_depth + token) * delta;
    }
    std::memcpy(state_.ckpt_conv + to * conv, from_conv, sizeof(float) * conv);
    std::memcpy(state_.ckpt_delta + to * delta, from_delta, sizeof(float) * delta);
  }
}

void LlamaForward::restore_verified(int64_t slot, int64_t tokens) {
  if (slot < 0 || slot >= state_.n_slots || tokens < 1 || tokens > state_.snap_depth) {
    fail("restore_verified: slot " + std::to_string(slot) + " or " + std::to_string(tokens) +
         " tokens out of range");
  }
  const RecurrentDims& r = dims_.recurrent;
  const int64_t conv = r.conv_dim() * (r.kernel - 1), delta = r.v_heads * r.k_dim * r.v_dim;
  for (int64_t l = 0; l < n_recurrent_; ++l) {
    const int64_t at = l * state_.n_slots + slot, snap = at * state_.snap_depth + tokens - 1;
    std::memcpy(state_.conv + at * conv, state_.snap_conv + snap * conv, sizeof(float) * conv);
    std::memcpy(state_.delta + at * delta, state_.snap_delta + snap * delta, sizeof(float) * delta);
  }
}

void LlamaForward::plan_recurrent(const ForwardBatch& batch) {
  const AttnRows& rows = batch.rows;
  if (state_.conv == nullptr) fail("no recurrent state was set (set_recurrent_state)");
  if (batch.state_slots == nullptr) fail("a model with recurrent layers needs state slots");
  std::vector<bool> taken(static_cast<size_t>(state_.n_slots), false);
  for (int64_t b = 0; b < rows.n_rows; ++b) {
    const int32_t slot = batch.state_slots[b];
    if (slot < 0 || slot >= state_.n_slots || taken[static_cast<size_t>(slot)]) {
      fail("state slot " + std::to_string(slot) + ": one per row, distinct, in 0.." +
           std::to_string(state_.n_slots - 1));
    }
    taken[static_cast<size_t>(slot)] = true;
    const int64_t q_len = rows.cu_seqlens[b + 1] - rows.cu_seqlens[b];
    if (batch.verify != nullptr && batch.verify[b] != 0 && q_len > state_.snap_depth) {
      fail("a verify row of " + std::to_string(q_len) + " tokens needs as many snapshots (" +
           std::to_string(state_.snap_depth) + " kept)");
    }
  }
  plan_checkpoints(batch);
}

void LlamaForward::plan_checkpoints(const ForwardBatch& batch) {
  const AttnRows& rows = batch.rows;
  ckpt_begin_.assign(static_cast<size_t>(rows.n_rows + 1), batch.n_checkpoints);
  for (int64_t i = batch.n_checkpoints - 1; i >= 0; --i) {
    const int64_t* c = batch.checkpoints + 3 * i;
    const int64_t b = c[0], pos = c[1], index = c[2];
    const bool in_order = i + 1 == batch.n_checkpoints || b < c[3] || (b == c[3] && pos < c[4]);
    const bool row_ok = b >= 0 && b < rows.n_rows && in_order;
    const int64_t q_len = row_ok ? rows.cu_seqlens[b + 1] - rows.cu_seqlens[b] : 0;
    const bool verify = row_ok && batch.verify != nullptr && batch.verify[b] != 0;
    if (!row_ok || q_len < 2 || verify || pos <= rows.seq_lens[b] - q_len ||
        pos > rows.seq_lens[b] || index < 0 || index >= state_.n_checkpoints) {
      fail("state checkpoint " + std::to_string(i) +
           ": (row, position, index) in order, inside a prefill row of 2+ tokens, index in 0.." +
           std::to_string(state_.n_checkpoints - 1));
    }
    for (int64_t r = 0; r <= b; ++r) ckpt_begin_[static_cast<size_t>(r)] = i;
  }
}

void LlamaForward::reset_new_rows(const ForwardBatch& batch) {
  const RecurrentDims& r = dims_.recurrent;
  const int64_t conv = r.conv_dim() * (r.kernel - 1), delta = r.v_heads * r.k_dim * r.v_dim;
  const AttnRows& rows = batch.rows;
  for (int64_t b = 0; b < rows.n_rows; ++b) {
    if (rows.seq_lens[b] != rows.cu_seqlens[b + 1] - rows.cu_seqlens[b]) continue;
    // A sequence at position 0 has seen nothing.
    for (int64_t l = 0; l < n_recurrent_; ++l) {
      const int64_t at = l * state_.n_slots + batch.state_slots[b];
      std::fill_n(state_.conv + at * conv, conv, 0.0f);
      std::fill_n(state_.delta + at * delta, delta, 0.0f);
    }
  }
}

void LlamaForward::recurrent_block(const LayerWeights& w, const ForwardBatch& batch,
                                   int64_t n_tokens) {
  const detail::QuantActs acts = quant_acts();
  const Projected p = projected(ssm_proj_, n_tokens, dims_.recurrent);
  // Disjoint outputs of one complete input: no barrier between the four.
  const std::pair<const QuantWeight*, float*> parts[] = {
      {&w.ssm_qkv, p.qkv}, {&w.ssm_z, p.z}, {&w.ssm_beta, p.beta}, {&w.ssm_alpha, p.alpha}};
  for (const auto& [weight, out] : parts) {
    matmul_acts_team(acts, weight->data, out, n_tokens, weight->n, dims_.dim, weight->q, isa_);
  }
  barrier_.wait();
  conv_channels(w, batch);
  barrier_.wait();
  delta_inputs(w, n_tokens);
  barrier_.wait();
  delta_items(w, batch);
  barrier_.wait();
  gated_output(w, n_tokens);
  barrier_.wait();
  matmul_acts_team(acts, w.ssm_out.data, delta_.data(), n_tokens, dims_.dim,
                   dims_.recurrent.value_width(), w.ssm_out.q, isa_);
  barrier_.wait();
}

void LlamaForward::conv_channels(const LayerWeights& w, const ForwardBatch& batch) {
  const RecurrentDims& r = dims_.recurrent;
  const int64_t channels = r.conv_dim(), taps = r.kernel, kept = taps - 1;
  const float* qkv = projected(ssm_proj_, tokens_of(batch), r).qkv;
  float* pool = state_.conv + w.state_index * state_.n_slots * channels * kept;
  const AttnRows& rows = batch.rows;
  // Each block of kConvLanes channels runs every row's tokens in order, the channels in the
  // lanes: a token's inputs are one contiguous load. A channel's last `kept` inputs (oldest
  // first; [slot][channel][kept] in the pool) carry from token to token in `window` and from step
  // to step in the pool. A lane's sum is the one-channel loop's, in its order.
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t c0 = 0; c0 < channels; c0 += kConvLanes) {
    const int64_t width = std::min(kConvLanes, channels - c0);
    float tap[kMaxTaps][kConvLanes] = {};
    for (int64_t l = 0; l < width; ++l) {
      for (int64_t j = 0; j < taps; ++j) tap[j][l] = w.ssm_conv[(c0 + l) * taps + j];
    }
    for (int64_t b = 0; b < rows.n_rows; ++b) {
      const int64_t slot = batch.state_slots[b];
      float* last = pool + (slot * channels + c0) * kept;  // lane l's window at l * kept
      // A ring: input j (oldest first) of the window is window[(oldest + j) % kept].
      float window[kMaxTaps][kConvLanes] = {};
      int64_t oldest = 0;
      for (int64_t l = 0; l < width; ++l) {
        for (int64_t j = 0; j < kept; ++j) window[j][l] = last[l * kept + j];
      }
      const bool verify = batch.verify != nullptr && batch.verify[b] != 0;
      const int64_t first = rows.cu_seqlens[b],
                    position = rows.seq_lens[b] - rows.cu_seqlens[b + 1];
      int64_t mark = ckpt_begin_[static_cast<size_t>(b)];
      for (int64_t t = first; t < rows.cu_seqlens[b + 1]; ++t) {
        float x[kConvLanes] = {};
        copy_lanes(x, qkv + t * channels + c0, width);
        float sum[kConvLanes] = {};
        for (int64_t j = 0; j < kept; ++j) {
          const int64_t at = oldest + j;
          const float* in = window[at < kept ? at : at - kept];
          for (int64_t l = 0; l < kConvLanes; ++l) sum[l] += tap[j][l] * in[l];
        }
        for (int64_t l = 0; l < kConvLanes; ++l) sum[l] += tap[kept][l] * x[l];
        std::memcpy(window[oldest], x, sizeof x);  // x takes the oldest input's place
        oldest = oldest + 1 < kept ? oldest + 1 : 0;
        activations_.silu(sum, kConvLanes);
        copy_lanes(ssm_mixed_.data() + t * channels + c0, sum, width);
        if (mark < ckpt_begin_[static_cast<size_t>(b + 1)] &&
            batch.checkpoints[3 * mark + 1] == position + t + 1) {
          const int64_t at = batch.checkpoints[3 * mark + 2] * n_recurrent_ + w.state_index;
          store_window(window, oldest, width, kept, state_.ckpt_conv + (at * channels + c0) * kept);
          ++mark;
        }
        if (!verify) continue;
        const int64_t token = t - first;
        const int64_t snap = (w.state_index * state_.n_slots + slot) * state_.snap_depth + token;
        store_window(window, oldest, width, kept, state_.snap_conv + (snap * channels + c0) * kept);
      }
      store_window(window, oldest, width, kept, last);
    }
  }
}

void LlamaForward::delta_inputs(const LayerWeights& w, int64_t n_tokens) {
  const RecurrentDims& r = dims_.recurrent;
  const int64_t channels = r.conv_dim(), key_width = r.k_heads * r.k_dim;
  const Projected p = projected(ssm_proj_, n_tokens, r);
  // In double, then rounded once: the torch forward's Python scalar k_dim ** -0.5.
  const auto q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(r.k_dim)));
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* mixed = ssm_mixed_.data() + t * channels;
    for (int64_t h = 0; h < r.k_heads; ++h) {
      l2_normalize(mixed + h * r.k_dim, r.k_dim, q_scale);
      l2_normalize(mixed + key_width + h * r.k_dim, r.k_dim, 1.0f);
    }
    const float* b = p.beta + t * r.v_heads;
    const float* a = p.alpha + t * r.v_heads;
    for (int64_t h = 0; h < r.v_heads; ++h) {
      ssm_beta_[t * r.v_heads + h] = sigmoid(b[h]);
      ssm_g_[t * r.v_heads + h] = w.ssm_a[h] * softplus(a[h] + w.ssm_dt[h]);
    }
  }
}

void LlamaForward::delta_items(const LayerWeights& w, const ForwardBatch& batch) {
  const RecurrentDims& r = dims_.recurrent;
  const AttnRows& rows = batch.rows;
  const int64_t channels = r.conv_dim(), vw = r.value_width(), vh = r.v_heads;
  const int64_t per_head = r.k_dim * r.v_dim, group = r.v_heads / r.k_heads;
  float* pool = state_.delta + w.state_index * state_.n_slots * vh * per_head;
  const DeltaStepHead step = delta_step_head_for(path_);
  const DeltaChunkHead chunk_head = delta_chunk_head_for(path_);
  // One item per (row, value head), each on its own state: dynamic, since prefill rows cost more.
#ifdef _OPENMP
#pragma omp for schedule(dynamic) nowait
#endif
  for (int64_t item = 0; item < rows.n_rows * vh; ++item) {
    const int64_t b = item / vh, h = item % vh;
    const int64_t key = r.tiled ? h % r.k_heads : h / group;
    const int64_t first = rows.cu_seqlens[b], n = rows.cu_seqlens[b + 1] - first;
    const int64_t slot = batch.state_slots[b];
    float* state = pool + (slot * vh + h) * per_head;
    float* scratch = ssm_scratch_.data() + thread_id() * ssm_scratch_stride_;
    const float* q = ssm_mixed_.data() + first * channels + key * r.k_dim;
    const float* k = q + r.k_heads * r.k_dim;
    const float* v = ssm_mixed_.data() + first * channels + 2 * r.k_heads * r.k_dim + h * r.v_dim;
    const float* g = ssm_g_.data() + first * vh + h;
    const float* beta = ssm_beta_.data() + first * vh + h;
    float* out = ssm_o_.data() + first * vw + h * r.v_dim;
    const bool verify = batch.verify != nullptr && batch.verify[b] != 0;
    if (n == 1 || verify) {  // decode's one-token step, token by token
      for (int64_t i = 0; i < n; ++i) {
        step(q + i * channels, k + i * channels, v + i * channels, g[i * vh], beta[i * vh], state,
             out + i * vw, r.k_dim, r.v_dim, scratch);
        if (!verify) continue;
        const int64_t snap = (w.state_index * state_.n_slots + slot) * state_.snap_depth + i;
        std::memcpy(state_.snap_delta + (snap * vh + h) * per_head, state,
                    sizeof(float) * per_head);
      }
      continue;
    }
    // Chunks end at multiples of kDeltaChunk positions, wherever the row starts, and at its
    // checkpoints (the state there is what a resumed row starts from).
    const int64_t start = rows.seq_lens[b] - n;
    int64_t mark = ckpt_begin_[static_cast<size_t>(b)];
    const int64_t marks_end = ckpt_begin_[static_cast<size_t>(b + 1)];
    for (int64_t i = 0; i < n;) {
      int64_t len = std::min(n - i, kDeltaChunk - (start + i) % kDeltaChunk);
      if (mark < marks_end) len = std::min(len, batch.checkpoints[3 * mark + 1] - start - i);
      const DeltaChunk c{q + i * channels,
                         k + i * channels,
                         v + i * channels,
                         g + i * vh,
                         beta + i * vh,
                         state,
                         out + i * vw,
                         len,
                         r.k_dim,
                         r.v_dim,
                         channels,
                         channels,
                         vw,
                         vh};
      chunk_head(c, scratch);
      i += len;
      if (mark < marks_end && batch.checkpoints[3 * mark + 1] == start + i) {
        const int64_t at = batch.checkpoints[3 * mark + 2] * n_recurrent_ + w.state_index;
        std::memcpy(state_.ckpt_delta + (at * vh + h) * per_head, state, sizeof(float) * per_head);
        ++mark;
      }
    }
  }
}

void LlamaForward::gated_output(const LayerWeights& w, int64_t n_tokens) {
  const RecurrentDims& r = dims_.recurrent;
  const int64_t vw = r.value_width();
  const float* gates = projected(ssm_proj_, n_tokens, r).z;
  const detail::QuantActs acts = quant_acts();
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* z = gates + t * vw;
    for (int64_t h = 0; h < r.v_heads; ++h) {
      float* o = ssm_o_.data() + t * vw + h * r.v_dim;
      rms_norm_row(o, w.ssm_norm, o, r.v_dim, dims_.norm_eps);
      activations_.silu_mul(z + h * r.v_dim, o, o, r.v_dim);
    }
    quantize_act_row(ssm_o_.data(), vw, t, acts, isa_);
  }
}

}  // namespace met::cpu
