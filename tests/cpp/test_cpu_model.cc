// The CPU model's elementwise kernels against double-precision references, and the layer loop's
// promises: a token's logits do not depend on the batch around it, on how its prompt was chunked
// or on the thread count (on every kernel path this CPU runs), and bad input is refused before the
// KV pool is touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/half.h"
#include "cpu/isa.h"
#include "cpu/llama_forward.h"
#include "cpu/ops.h"
#include "cpu/quant_matmul.h"

namespace met::cpu {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST(CpuOps, RmsNormMatchesDoubleReference) {
  const int64_t dim = 576;
  const auto x = random_floats(dim, 1, -30.0f, 30.0f);
  const auto w = random_floats(dim, 2);
  std::vector<float> out(dim);
  rms_norm_row(x.data(), w.data(), out.data(), dim, 1e-5f);
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
  for (int64_t i = 0; i < dim; ++i) {
    ASSERT_TRUE(std::isfinite(out[i]));
    EXPECT_NEAR(out[i], x[i] * inv * w[i], 1e-5 * (1 + std::fabs(x[i] * inv * w[i])));
  }
}

TEST(CpuOps, RopeRotatesPairsHalfADimApart) {
  const int64_t hd = 64;
  auto v = random_floats(hd, 3);
  const auto orig = v;
  std::vector<float> cos(hd / 2), sin(hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i) {
    cos[i] = static_cast<float>(std::cos(0.1 * (i + 1)));
    sin[i] = static_cast<float>(std::sin(0.1 * (i + 1)));
  }
  rope_rotate_half(v.data(), cos.data(), sin.data(), hd);
  for (int64_t i = 0; i < hd / 2; ++i) {
    const double a = orig[i], b = orig[i + hd / 2];
    EXPECT_NEAR(v[i], a * cos[i] - b * sin[i], 1e-6);
    EXPECT_NEAR(v[i + hd / 2], b * cos[i] + a * sin[i], 1e-6);
  }
}

TEST(CpuOps, SiluMulMatchesDoubleReference) {
  const int64_t n = 1536;
  const auto gate = random_floats(n, 4, -20.0f, 20.0f);
  const auto up = random_floats(n, 5);
  std::vector<float> out(n);
  silu_mul_row(gate.data(), up.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double want = g / (1.0 + std::exp(-g)) * up[i];
    ASSERT_TRUE(std::isfinite(out[i]));
    EXPECT_NEAR(out[i], want, 1e-6 * (1 + std::fabs(want)));
  }
}

TEST(CpuOps, GeluTanhMulAndSoftcapMatchDoubleReferences) {
  const int64_t n = 1536;
  const auto gate = random_floats(n, 6, -20.0f, 20.0f);
  const auto up = random_floats(n, 7);
  std::vector<float> out(n);
  gelu_tanh_mul_row(gate.data(), up.data(), out.data(), n);
  std::vector<float> capped = gate;
  softcap_row(capped.data(), 5.0f, n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double inner = std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g);
    const double want = 0.5 * g * (1.0 + std::tanh(inner)) * up[i];
    EXPECT_NEAR(out[i], want, 1e-6 * (1 + std::fabs(want)));
    EXPECT_NEAR(capped[i], 5.0 * std::tanh(g / 5.0), 1e-6);
  }
}

// Each path's build of the activations (ops.h Activations) gives the scalar build's bits: on a
// length that leaves a remainder after every vector loop, and on inputs past the exponential's
// clamp.
TEST(CpuOps, EveryPathsActivationsGiveTheScalarBits) {
  const int64_t n = 1531;
  const auto gate = random_floats(n, 8, -100.0f, 100.0f);
  const auto up = random_floats(n, 9, -3.0f, 3.0f);
  const auto run = [&](const Activations& a) {
    std::vector<float> out(static_cast<size_t>(6 * n));
    float* o = out.data();
    a.silu_mul(gate.data(), up.data(), o, n);
    std::copy(gate.begin(), gate.end(), o + n);
    a.silu(o + n, n);
    a.clamped_swiglu(gate.data(), up.data(), o + 2 * n, n, 7.0f, 1.702f);
    a.gelu_tanh_mul(gate.data(), up.data(), o + 3 * n, n);
    std::copy(gate.begin(), gate.end(), o + 4 * n);
    a.softcap(o + 4 * n, 30.0f, n);
    a.exp_shifted(gate.data(), 3.0f, o + 5 * n, n);
    return out;
  };
  const Activations& scalar = activations_for(CpuPath::kScalar);
  const std::vector<float> want = run(scalar);
  for (const CpuPath path : kAllPaths) {
    if (!path_supported(path)) continue;
    const Activations& act = activations_for(path);
#if defined(__x86_64__)
    if (path != CpuPath::kScalar) EXPECT_NE(act.silu_mul, scalar.silu_mul) << path_name(path);
#endif
    const std::vector<float> got = run(act);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), sizeof(float) * want.size()))
        << path_name(path);
  }
}

// A tiny random model with Q8_0 weights (scale 2^-6 as fp16 bits, random int8 quants).
struct TinyModel {
  LlamaDims dims;
  std::vector<std::vector<uint8_t>> blobs;
  std::vector<std::vector<float>> floats;
  std::vector<float> k_cache, v_cache;
  std::vector<uint16_t> k16, v16;  // the pool with dims.kv_half
  LlamaWeights weights;

  // n_experts > 0: every MLP is a mixture of that many experts, two used per token.
  explicit TinyModel(bool kv_half = false, int64_t n_experts = 0) {
    dims.kv_half = kv_half;
    dims.n_experts = n_experts;
    dims.n_experts_used = n_experts > 0 ? 2 : 0;
    dims.dim = 64;
    dims.n_layers = 2;
    dims.n_heads = 4;
    dims.n_kv_heads = 2;
    dims.head_dim = 16;
    dims.ffn = 96;
    dims.vocab = 50;
    dims.norm_eps = 1e-5f;
    dims.max_positions = 64;
    dims.num_blocks = 32;
    dims.block_size = 4;
    blobs.reserve(16 + 4 * n_experts);
    floats.reserve(16 + 2 * n_experts);
    uint32_t seed = 10;
    weights.embed = quant(dims.vocab, dims.dim, seed++);
    weights.lm_head = weights.embed;
    weights.norm = norm(seed++);
    for (int64_t l = 0; l < dims.n_layers; ++l) {
      LayerWeights lw;
      lw.attn_norm = norm(seed++);
      lw.wqkv = quant((dims.n_heads + 2 * dims.n_kv_heads) * dims.head_dim, dims.dim, seed++);
      lw.wo = quant(dims.dim, dims.n_heads * dims.head_dim, seed++);
      lw.mlp_norm = norm(seed++);
      if (n_experts > 0) {
        lw.mlp = Mlp::kMoe;
        floats.push_back(random_floats(n_experts * dims.dim, seed++));
        lw.router = floats.back().data();
        for (int64_t e = 0; e < n_experts; ++e) {
          lw.expert_gate_up.push_back(quant(2 * dims.ffn, dims.dim, seed++));
          lw.expert_down.push_back(quant(dims.dim, dims.ffn, seed++));
        }
      } else {
        lw.w_gate_up = quant(2 * dims.ffn, dims.dim, seed++);
        lw.w_down = quant(dims.dim, dims.ffn, seed++);
      }
      weights.layers.push_back(lw);
    }
    std::vector<float> cos(dims.max_positions * dims.head_dim / 2), sin(cos.size());
    for (int64_t p = 0; p < dims.max_positions; ++p) {
      for (int64_t i = 0; i < dims.head_dim / 2; ++i) {
        const double angle = p * std::pow(10000.0, -2.0 * i / dims.head_dim);
        cos[p * dims.head_dim / 2 + i] = static_cast<float>(std::cos(angle));
        sin[p * dims.head_dim / 2 + i] = static_cast<float>(std::sin(angle));
      }
    }
    floats.push_back(cos);
    weights.rope_cos = floats.back().data();
    floats.push_back(sin);
    weights.rope_sin = floats.back().data();
    const size_t pool =
        dims.n_layers * dims.num_blocks * dims.block_size * dims.n_kv_heads * dims.head_dim;
    k_cache.assign(pool, 0.0f);
    v_cache.assign(pool, 0.0f);
    k16.assign(pool, 0);
    v16.assign(pool, 0);
  }

  QuantWeight quant(int64_t n, int64_t k, uint32_t seed) {
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> q(-127, 127);
    std::vector<uint8_t> blob(n * row_bytes(QType::kQ8_0, k));
    for (size_t b = 0; b < blob.size(); b += 34) {
      const uint16_t scale = 0x2400;  // 2^-6
      std::memcpy(&blob[b], &scale, 2);
      for (int i = 0; i < 32; ++i)
        blob[b + 2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q(gen)));
    }
    blobs.push_back(std::move(blob));
    return QuantWeight{blobs.back().data(), QType::kQ8_0, n, k};
  }

  const float* norm(uint32_t seed) {
    floats.push_back(random_floats(dims.dim, seed, 0.5f, 1.5f));
    return floats.back().data();
  }

  LlamaForward make(int threads) {
    if (dims.kv_half) return LlamaForward(dims, weights, k16.data(), v16.data(), threads);
    return LlamaForward(dims, weights, k_cache.data(), v_cache.data(), threads);
  }
};

// One row of a packed batch, as the backend would describe it.
struct Row {
  std::vector<int64_t> tokens;  // this step's tokens
  int32_t seq_len;              // context including them
  std::vector<int32_t> table;
};

std::vector<float> run(LlamaForward& f, const std::vector<Row>& rows, int64_t vocab) {
  std::vector<int64_t> ids, logits_rows;
  std::vector<int32_t> cu{0}, lens, tables;
  const size_t stride = 8;
  for (const Row& r : rows) {
    ids.insert(ids.end(), r.tokens.begin(), r.tokens.end());
    cu.push_back(static_cast<int32_t>(ids.size()));
    logits_rows.push_back(static_cast<int64_t>(ids.size()) - 1);
    lens.push_back(r.seq_len);
    std::vector<int32_t> padded = r.table;
    padded.resize(stride, 0);
    tables.insert(tables.end(), padded.begin(), padded.end());
  }
  ForwardBatch batch;
  batch.ids = ids.data();
  batch.rows = AttnRows{static_cast<int64_t>(rows.size()), cu.data(), lens.data(), tables.data(),
                        static_cast<int64_t>(stride)};
  batch.logits_rows = logits_rows.data();
  batch.n_logits = static_cast<int64_t>(logits_rows.size());
  std::vector<float> logits(logits_rows.size() * vocab);
  f.forward(batch, logits.data());
  return logits;
}

const std::vector<int64_t> kPrompt = {3, 17, 5, 42, 8, 8, 1, 30, 22, 9, 14};

std::vector<float> last_logits(const std::vector<float>& all, size_t row, int64_t vocab) {
  return std::vector<float>(all.begin() + row * vocab, all.begin() + (row + 1) * vocab);
}

// Each forward test runs once per kernel path (MET_CPU_ISA's values), skipped where the CPU
// cannot take it, and once more on the amx path with its tiles emulated in scalar code (so a CPU
// without AMX runs the amx kernels' packing, blocking and epilogue through whole forwards); a
// LlamaForward fixes the path active when it is built. On the amx paths every matmul takes tiles
// (from 1 row: these batches are small).
struct PathCase {
  CpuPath path;
  bool emulated_tiles;
};

class CpuModelOnPath : public ::testing::TestWithParam<PathCase> {
 protected:
  void SetUp() override {
    before_ = active_path();
    set_amx_emulation(GetParam().emulated_tiles);
    set_amx_min_rows(1);
    const std::string why = path_unsupported_reason(GetParam().path);
    if (!why.empty()) GTEST_SKIP() << path_name(GetParam().path) << ": " << why;
    set_active_path(GetParam().path);
  }
  void TearDown() override {
    set_amx_emulation(false);
    set_amx_min_rows(kAmxMinRows);
    set_active_path(before_);
  }

 private:
  CpuPath before_ = CpuPath::kScalar;
};

std::vector<PathCase> path_cases() {
  std::vector<PathCase> cases;
  for (const CpuPath path : kAllPaths) cases.push_back({path, false});
  cases.push_back({CpuPath::kAmx, true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Paths, CpuModelOnPath, ::testing::ValuesIn(path_cases()),
                         [](const ::testing::TestParamInfo<PathCase>& info) {
                           return std::string(path_name(info.param.path)) +
                                  (info.param.emulated_tiles ? "_emulated_tiles" : "");
                         });

TEST_P(CpuModelOnPath, PromptChunkingDoesNotChangeABit) {
  TinyModel m;
  LlamaForward f = m.make(2);
  const std::vector<int32_t> table = {5, 2, 9};
  const int32_t n = static_cast<int32_t>(kPrompt.size());
  const auto whole = run(f, {{kPrompt, n, table}}, m.dims.vocab);
  const auto k_whole = m.k_cache;

  TinyModel m2;
  LlamaForward f2 = m2.make(2);
  std::vector<float> chunked;
  for (int32_t start = 0; start < n; start += 4) {
    const int32_t end = std::min(n, start + 4);
    chunked =
        run(f2, {{{kPrompt.begin() + start, kPrompt.begin() + end}, end, table}}, m2.dims.vocab);
  }
  EXPECT_EQ(whole, chunked);
  EXPECT_EQ(k_whole, m2.k_cache);
  ASSERT_EQ(f.argmax().size(), 1u);
  EXPECT_EQ(f.argmax()[0], std::max_element(whole.begin(), whole.end()) - whole.begin());
  for (float v : whole) ASSERT_TRUE(std::isfinite(v));
}

TEST_P(CpuModelOnPath, DecodeRowIsTheSameAloneAndInAMixedBatch) {
  TinyModel m;
  LlamaForward f = m.make(2);
  const int32_t n = static_cast<int32_t>(kPrompt.size());
  run(f, {{kPrompt, n, {1, 2, 3, 4}}}, m.dims.vocab);
  const auto alone = run(f, {{{7}, n + 1, {1, 2, 3, 4}}}, m.dims.vocab);
  // The same step again (it rewrites the same K/V slot) beside a decode row and a prefill chunk
  // of other sequences.
  run(f, {{{4, 4, 4, 4, 4}, 5, {10, 11}}}, m.dims.vocab);
  const auto mixed = run(
      f, {{{9}, 6, {10, 11}}, {{7}, n + 1, {1, 2, 3, 4}}, {{2, 3, 5, 7, 11, 13, 17}, 7, {20, 21}}},
      m.dims.vocab);
  EXPECT_EQ(alone, last_logits(mixed, 1, m.dims.vocab));
}

TEST_P(CpuModelOnPath, Fp16PoolStoresRoundedKvAndKeepsChunkingInvariance) {
  const int32_t n = static_cast<int32_t>(kPrompt.size());
  const std::vector<int32_t> table = {5, 2, 9};
  TinyModel full;
  LlamaForward f_full = full.make(2);
  const auto want = run(f_full, {{kPrompt, n, table}}, full.dims.vocab);
  TinyModel half(true), chunks(true);
  LlamaForward f_half = half.make(2);
  LlamaForward f_chunks = chunks.make(1);
  const auto whole = run(f_half, {{kPrompt, n, table}}, half.dims.vocab);
  std::vector<float> chunked;
  for (int32_t start = 0; start < n; start += 3) {
    const int32_t end = std::min(n, start + 3);
    chunked = run(f_chunks, {{{kPrompt.begin() + start, kPrompt.begin() + end}, end, table}},
                  chunks.dims.vocab);
  }
  EXPECT_EQ(whole, chunked);
  EXPECT_EQ(half.k16, chunks.k16);
  // Layer 0's K/V are computed before any attention: the fp32 pool's values, rounded.
  const size_t layer = half.k16.size() / half.dims.n_layers;
  for (size_t i = 0; i < layer; ++i) {
    ASSERT_EQ(half.k16[i], fp32_to_fp16(full.k_cache[i])) << i;
    ASSERT_EQ(half.v16[i], fp32_to_fp16(full.v_cache[i])) << i;
  }
  // Later layers see rounded K/V, and int8 activations can round the other way after them:
  // close to the fp32 pool's logits (observed 1.6% of the largest), not equal.
  float largest = 0.0f, worst = 0.0f;
  for (size_t i = 0; i < want.size(); ++i) {
    largest = std::max(largest, std::fabs(want[i]));
    worst = std::max(worst, std::fabs(whole[i] - want[i]));
  }
  EXPECT_LT(worst, 0.05f * largest);
}

TEST_P(CpuModelOnPath, ThreadCountDoesNotChangeABit) {
  TinyModel a, b;
  LlamaForward one = a.make(1);
  LlamaForward two = b.make(2);
  const int32_t n = static_cast<int32_t>(kPrompt.size());
  EXPECT_EQ(run(one, {{kPrompt, n, {0, 1, 2}}}, a.dims.vocab),
            run(two, {{kPrompt, n, {0, 1, 2}}}, b.dims.vocab));
}

// Tokens grouped by expert: a row's logits must not depend on which other tokens share its
// experts, on chunking or on the thread count (a and b: the same model twice).
void expect_moe_rows_invariant(TinyModel& a, TinyModel& b) {
  const int32_t n = static_cast<int32_t>(kPrompt.size());
  const std::vector<int32_t> table = {5, 2, 9};
  LlamaForward one = a.make(1);
  LlamaForward two = b.make(2);
  const auto whole = run(one, {{kPrompt, n, table}}, a.dims.vocab);
  std::vector<float> chunked;
  for (int32_t start = 0; start < n; start += 4) {
    const int32_t end = std::min(n, start + 4);
    chunked =
        run(two, {{{kPrompt.begin() + start, kPrompt.begin() + end}, end, table}}, b.dims.vocab);
  }
  EXPECT_EQ(whole, chunked);
  const auto alone = run(one, {{{7}, n + 1, table}}, a.dims.vocab);
  run(two, {{{4, 4, 4, 4, 4}, 5, {10, 11}}}, b.dims.vocab);
  const auto mixed =
      run(two, {{{9}, 6, {10, 11}}, {{7}, n + 1, table}, {{2, 3, 5, 7, 11, 13, 17}, 7, {20, 21}}},
          b.dims.vocab);
  EXPECT_EQ(alone, last_logits(mixed, 1, b.dims.vocab));
  for (float v : whole) ASSERT_TRUE(std::isfinite(v));
}

TEST_P(CpuModelOnPath, MoeRowsDoNotDependOnBatchChunksOrThreads) {
  TinyModel a(false, 4), b(false, 4);
  expect_moe_rows_invariant(a, b);
}

// Gemma 4's MoE layers on TinyModel's: a GeLU dense MLP of ffn beside experts 32 wide, their own
// input and output norms, the router scaled and each expert's weight too.
void make_dense_and_moe(TinyModel& m) {
  LlamaDims& d = m.dims;
  d.expert_ffn = 32;
  d.gelu = true;
  uint32_t seed = 300;
  for (LayerWeights& l : m.weights.layers) {
    l.mlp = Mlp::kDenseAndMoe;
    l.w_gate_up = m.quant(2 * d.ffn, d.dim, seed++);
    l.w_down = m.quant(d.dim, d.ffn, seed++);
    for (size_t e = 0; e < l.expert_gate_up.size(); ++e) {
      l.expert_gate_up[e] = m.quant(2 * d.expert_ffn, d.dim, seed++);
      l.expert_down[e] = m.quant(d.dim, d.expert_ffn, seed++);
    }
    l.moe_norm = m.norm(seed++);
    l.post_mlp_norm_1 = m.norm(seed++);
    l.post_moe_norm = m.norm(seed++);
    l.router_scale = m.norm(seed++);
    m.floats.push_back(random_floats(d.n_experts, seed++, 0.5f, 1.5f));
    l.expert_scale = m.floats.back().data();
  }
}

TEST_P(CpuModelOnPath, DenseAndMoeRowsDoNotDependOnBatchChunksOrThreads) {
  TinyModel a(false, 4), b(false, 4);
  make_dense_and_moe(a);
  make_dense_and_moe(b);
  expect_moe_rows_invariant(a, b);
}

TEST(CpuModel, DenseAndMoeLayersReadEveryPartAndRefuseMissingOnes) {
  const int32_t n = static_cast<int32_t>(kPrompt.size());
  TinyModel scaled(false, 4), unscaled(false, 4);
  make_dense_and_moe(scaled);
  make_dense_and_moe(unscaled);
  for (LayerWeights& l : unscaled.weights.layers) l.expert_scale = nullptr;
  LlamaForward a = scaled.make(1), b = unscaled.make(1);
  EXPECT_NE(run(a, {{kPrompt, n, {0, 1, 2}}}, scaled.dims.vocab),
            run(b, {{kPrompt, n, {0, 1, 2}}}, unscaled.dims.vocab));
  TinyModel no_norm(false, 4), wide_experts(false, 4), moe_scaled(false, 4);
  make_dense_and_moe(no_norm);
  no_norm.weights.layers[1].post_moe_norm = nullptr;
  EXPECT_THROW(no_norm.make(1), std::invalid_argument);
  make_dense_and_moe(wide_experts);
  wide_experts.dims.expert_ffn = 0;  // the experts are 32 wide, not ffn
  EXPECT_THROW(wide_experts.make(1), std::invalid_argument);
  // A scaled router reads the residual stream, which a plain MoE layer does not route.
  moe_scaled.weights.layers[0].router_scale = moe_scaled.weights.layers[0].mlp_norm;
  EXPECT_THROW(moe_scaled.make(1), std::invalid_argument);
}

// A MoE model whose second layer has a dense MLP instead (a stack mixing kinds, as DeepSeek's
// first layers or a hybrid model's).
TinyModel mixed_mlp_model() {
  TinyModel m(false, 4);
  LayerWeights& dense = m.weights.layers[1];
  dense.mlp = Mlp::kDense;
  dense.w_gate_up = m.quant(2 * m.dims.ffn, m.dims.dim, 900);
  dense.w_down = m.quant(m.dims.dim, m.dims.ffn, 901);
  return m;
}

TEST(CpuModel, EachLayerRunsItsOwnKind) {
  const int32_t n = static_cast<int32_t>(kPrompt.size());
  const std::vector<int32_t> table = {5, 2, 9};
  TinyModel a = mixed_mlp_model(), b = mixed_mlp_model(), moe(false, 4);
  LlamaForward one = a.make(1), two = b.make(2), all_moe = moe.make(1);
  const auto whole = run(one, {{kPrompt, n, table}}, a.dims.vocab);
  run(two, {{{kPrompt.begin(), kPrompt.begin() + 5}, 5, table}}, b.dims.vocab);
  const auto chunked = run(two, {{{kPrompt.begin() + 5, kPrompt.end()}, n, table}}, b.dims.vocab);
  EXPECT_EQ(whole, chunked);
  EXPECT_NE(whole, run(all_moe, {{kPrompt, n, table}}, moe.dims.vocab));
  TinyModel recurrent;
  recurrent.weights.layers[1].mixer = Mixer::kRecurrent;
  EXPECT_THROW(recurrent.make(1), std::invalid_argument);
}

// Gemma 4's layers (its 31B's kind) on TinyModel's weights: layer 0 as it is, layer 1 with heads
// twice as wide, one KV head, V from K and its own RoPE tables, layer 2 attending over layer 0's
// K/V; V norms and output scales everywhere. Pages per width, as the pool keeps them.
struct Gemma4Layers {
  TinyModel m;
  std::vector<float> k0, v0, k1, v1, ones16, ones32, scale = {0.75f};

  Gemma4Layers() {
    LlamaDims& d = m.dims;
    d.n_layers = 3;
    const size_t slots = d.num_blocks * d.block_size;
    k0.assign(slots * d.n_kv_heads * d.head_dim, 0.0f);
    v0 = k0;
    k1.assign(slots * 1 * 32, 0.0f);
    v1 = k1;
    ones16.assign(16, 1.0f);
    ones32.assign(32, 1.0f);
    uint32_t seed = 200;
    LayerWeights wide = m.weights.layers[1];
    wide.head_dim = 32;
    wide.n_kv_heads = 1;
    wide.k_as_v = true;
    wide.wqkv = m.quant((d.n_heads + 1) * 32, d.dim, seed++);
    wide.wo = m.quant(d.dim, d.n_heads * 32, seed++);
    m.floats.push_back(random_floats(32, seed++, 0.5f, 1.5f));
    wide.q_norm = wide.k_norm = m.floats.back().data();
    m.floats.push_back(std::vector<float>(d.max_positions * 16));
    m.floats.push_back(std::vector<float>(d.max_positions * 16));
    for (int64_t p = 0; p < d.max_positions; ++p) {
      for (int64_t i = 0; i < 16; ++i) {
        const double angle = p * std::pow(1e6, -2.0 * i / 32) * (i < 4 ? 1.0 : 0.0);
        m.floats[m.floats.size() - 2][p * 16 + i] = static_cast<float>(std::cos(angle));
        m.floats.back()[p * 16 + i] = static_cast<float>(std::sin(angle));
      }
    }
    wide.rope_cos = m.floats[m.floats.size() - 2].data();
    wide.rope_sin = m.floats.back().data();
    wide.k_pages = k1.data();
    wide.v_pages = v1.data();
    wide.v_norm = ones32.data();
    LayerWeights shared = m.weights.layers[0];
    shared.shared_kv = true;
    shared.wqkv = m.quant(d.n_heads * d.head_dim, d.dim, seed++);
    shared.k_norm = nullptr;
    m.weights.layers[1] = wide;
    m.weights.layers.push_back(shared);
    for (size_t l : {size_t{0}, size_t{2}}) {
      m.weights.layers[l].k_pages = k0.data();
      m.weights.layers[l].v_pages = v0.data();
      m.weights.layers[l].v_norm = ones16.data();
    }
    for (LayerWeights& l : m.weights.layers) l.out_scale = scale.data();
  }
};

TEST_P(CpuModelOnPath, Gemma4LayersKeepChunkingAndBatchInvariance) {
  const int32_t n = static_cast<int32_t>(kPrompt.size());
  const std::vector<int32_t> table = {5, 2, 9};
  Gemma4Layers a, b;
  LlamaForward one = a.m.make(1);
  LlamaForward two = b.m.make(2);
  const auto whole = run(one, {{kPrompt, n, table}}, a.m.dims.vocab);
  std::vector<float> chunked;
  for (int32_t start = 0; start < n; start += 4) {
    const int32_t end = std::min(n, start + 4);
    chunked =
        run(two, {{{kPrompt.begin() + start, kPrompt.begin() + end}, end, table}}, b.m.dims.vocab);
  }
  EXPECT_EQ(whole, chunked);
  EXPECT_EQ(a.k0, b.k0);
  EXPECT_EQ(a.v1, b.v1);
  // Layer 1's V is its K projection, normalized: its pages hold values, and differ from K's.
  EXPECT_NE(a.k1, a.v1);
  EXPECT_NE(a.v1, std::vector<float>(a.v1.size(), 0.0f));
  const auto alone = run(one, {{{7}, n + 1, table}}, a.m.dims.vocab);
  run(two, {{{4, 4, 4, 4, 4}, 5, {10, 11}}}, b.m.dims.vocab);
  const auto mixed =
      run(two, {{{9}, 6, {10, 11}}, {{7}, n + 1, table}, {{2, 3, 5, 7, 11, 13, 17}, 7, {20, 21}}},
          b.m.dims.vocab);
  EXPECT_EQ(alone, last_logits(mixed, 1, b.m.dims.vocab));
  for (float v : whole) ASSERT_TRUE(std::isfinite(v));
}

TEST(CpuModel, Gemma4LayersOfTheWrongShapeAreRefused) {
  Gemma4Layers wide_qkv;  // a shared-KV layer projects Q only
  wide_qkv.m.weights.layers[2].wqkv = wide_qkv.m.weights.layers[0].wqkv;
  EXPECT_THROW(wide_qkv.m.make(1), std::invalid_argument);
  Gemma4Layers no_tables;  // a width of its own needs its own RoPE tables
  no_tables.m.weights.layers[1].rope_cos = nullptr;
  EXPECT_THROW(no_tables.m.make(1), std::invalid_argument);
  Gemma4Layers no_pages;
  no_pages.m.weights.layers[2].k_pages = no_pages.m.weights.layers[2].v_pages = nullptr;
  EXPECT_THROW(no_pages.m.make(1), std::invalid_argument);
}

TEST(CpuModel, BadInputIsRefusedBeforeThePoolIsTouched) {
  TinyModel m;
  LlamaForward f = m.make(2);
  const auto before = m.k_cache;
  EXPECT_THROW(run(f, {{{1, 2}, 2, {99}}}, m.dims.vocab), std::invalid_argument);  // block id
  EXPECT_THROW(run(f, {{{1, 2}, 2, {0}}, {{77}, 1, {1}}}, m.dims.vocab),
               std::invalid_argument);                                                // token id
  EXPECT_THROW(run(f, {{{1}, 65, {0, 1, 2}}}, m.dims.vocab), std::invalid_argument);  // position
  EXPECT_THROW(run(f, {{{1, 2, 3}, 2, {0}}}, m.dims.vocab), std::invalid_argument);   // q > ctx
  EXPECT_EQ(before, m.k_cache);
}

TEST(CpuModel, RejectsWeightsOfTheWrongShape) {
  TinyModel m;
  m.weights.layers[1].wo.n = 10;
  EXPECT_THROW(m.make(1), std::invalid_argument);
  TinyModel moe(false, 4);
  moe.weights.layers[0].expert_down[3].k = 64;
  EXPECT_THROW(moe.make(1), std::invalid_argument);
  TinyModel missing(false, 4);
  missing.weights.layers[1].expert_gate_up.pop_back();
  EXPECT_THROW(missing.make(1), std::invalid_argument);
}

TEST(CpuPaths, ScalarIsAlwaysThereAndTheBestIsSupported) {
  EXPECT_TRUE(path_supported(CpuPath::kScalar));
  EXPECT_TRUE(path_supported(best_path()));
  for (const CpuPath path : kAllPaths) EXPECT_EQ(parse_path(path_name(path)), path);
  EXPECT_THROW(parse_path("avx512vnni"), std::invalid_argument);
  for (const CpuPath path : kAllPaths) {
    if (!path_supported(path)) EXPECT_THROW(set_active_path(path), std::runtime_error);
  }
}

// The default for CPUs this machine is not: the fastest path the CPU runs, amx included (its
// full-density tiles beat the VNNI kernel on AMX hardware), never the emulated tiles.
TEST(CpuPaths, TheDefaultIsTheFastestPathTheCpuRuns) {
  CpuFeatures avx2;
  avx2.avx2 = avx2.fma = avx2.f16c = true;
  CpuFeatures avx512 = avx2;
  avx512.avx512f = avx512.avx512bw = avx512.avx512vl = avx512.avx512vnni = true;
  avx512.avx512bf16 = true;
  CpuFeatures amx = avx512;
  amx.amx_tile = amx.amx_int8 = amx.amx_bf16 = amx.amx_permitted = true;
  CpuFeatures amx_refused = amx;
  amx_refused.amx_permitted = false;

  EXPECT_EQ(path_unsupported_reason_for(CpuPath::kAmx, amx, false), "");
  EXPECT_EQ(default_path_for(amx), CpuPath::kAmx);
  EXPECT_EQ(default_path_for(amx_refused), CpuPath::kAvx512);
  EXPECT_EQ(default_path_for(avx512), CpuPath::kAvx512);  // emulated tiles are never a default
  EXPECT_EQ(default_path_for(avx2), CpuPath::kAvx2);
  EXPECT_EQ(default_path_for(CpuFeatures{}), CpuPath::kScalar);
  EXPECT_NE(path_unsupported_reason_for(CpuPath::kAmx, amx_refused, false), "");
  EXPECT_EQ(path_unsupported_reason_for(CpuPath::kAmx, avx512, true), "");
  // This machine's own choice follows the same rule.
  EXPECT_EQ(best_path(), default_path_for(cpu_features()));
}

TEST(CpuPaths, AForwardKeepsThePathItWasBuiltOn) {
  const CpuPath before = active_path();
  TinyModel m;
  set_active_path(CpuPath::kScalar);
  LlamaForward f = m.make(1);
  set_active_path(before);
  EXPECT_STREQ(f.path(), "scalar");
  EXPECT_STREQ(f.isa(), "scalar");
}

TEST(CpuPaths, TheAmxPathGivesTheAvx512PathsLogitsOnTilesOrNot) {
  // The same exact per-block dots and float epilogue on tiles (emulated here unless the CPU has
  // AMX) as on VNNI registers: whole forwards agree bit for bit with the avx512 path's (VNNI
  // registers for every M) whichever rows take tiles (all from 1 row, only the prompt's from 4,
  // or none below 16).
  const CpuPath before = active_path();
  if (!path_supported(CpuPath::kAvx512))
    GTEST_SKIP() << "avx512: " << path_unsupported_reason(CpuPath::kAvx512);
  set_amx_emulation(!path_supported(CpuPath::kAmx));  // real tiles where the CPU has them
  if (!path_supported(CpuPath::kAmx)) {
    set_amx_emulation(false);
    GTEST_SKIP() << "amx: " << path_unsupported_reason(CpuPath::kAmx);
  }
  const int32_t n = static_cast<int32_t>(kPrompt.size());
  std::vector<std::vector<float>> logits;
  for (const int64_t min_rows : {int64_t{0}, int64_t{1}, int64_t{4}, kAmxMinRows}) {
    set_active_path(min_rows == 0 ? CpuPath::kAvx512 : CpuPath::kAmx);
    set_amx_min_rows(min_rows == 0 ? kAmxMinRows : min_rows);
    TinyModel m;
    LlamaForward f = m.make(2);
    auto prompt = run(f, {{kPrompt, n, {1, 2, 3}}}, m.dims.vocab);
    const auto decode = run(f, {{{7}, n + 1, {1, 2, 3}}}, m.dims.vocab);
    prompt.insert(prompt.end(), decode.begin(), decode.end());
    logits.push_back(prompt);
    EXPECT_STREQ(f.isa(), min_rows == 0 ? "avx512vnni" : isa_name(isa_for(CpuPath::kAmx)));
  }
  set_amx_emulation(false);
  set_amx_min_rows(kAmxMinRows);
  set_active_path(before);
  EXPECT_EQ(logits[1], logits[0]);
  EXPECT_EQ(logits[2], logits[0]);
  EXPECT_EQ(logits[3], logits[0]);
}

}  // namespace
}  // namespace met::cpu
