// paged_attention (csrc/cpu/attention.h) against a double-precision reference written here, on
// every SIMD path the CPU runs; every path's bits against the portable path's; and its batch
// invariance: a query's output bits must not change with the batch around it, its row's q_len
// or the number of threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/attention.h"
#include "cpu/attention_internal.h"
#include "cpu/half.h"

namespace met::cpu {
namespace {

// The kernel sums scores in fp32, rounds V and its softmax weights to bf16 and sums their exact
// products in fp32 (attention_item.inc). The reference rounds V the same way and does the rest in
// double, so what is left is the weights' rounding: each weight off by at most 2^-9 relative,
// which moves an output element by at most 2^-8 times the largest |value| it averages (the
// normalization takes back the common part), plus fp32 sums (under 1e-5 here).
constexpr double kWeightRounding = 1.0 / 256 * 1.01;
constexpr double kTolerance = 1e-5;

// x rounded to the nearest bf16 (ties to even), as fp32: written here from the format, not
// taken from the kernel.
float bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&x, &u, sizeof(u));
  return x;
}

// K/V for a few sequences in one pool, each sequence on shuffled blocks, plus one query vector
// per (sequence, position). Slots no sequence owns hold NaN, so reading one poisons the output.
struct Pool {
  AttnShape shape;
  std::vector<float> k, v;
  std::vector<uint16_t> k16, v16;            // the fp16 pool read when shape.kv_half
  std::vector<std::vector<int32_t>> tables;  // per sequence
  std::vector<std::vector<float>> queries;   // per sequence: [length, n_heads * head_dim]
};

Pool make_pool(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t block_size,
               const std::vector<int64_t>& lengths, float q_gain, uint32_t seed) {
  Pool pool;
  pool.shape = {n_heads, n_kv_heads, head_dim, block_size,
                1.0f / std::sqrt(static_cast<float>(head_dim))};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int64_t n_blocks = 2;  // two spares no sequence owns
  for (const int64_t len : lengths) n_blocks += (len + block_size - 1) / block_size;
  std::vector<int32_t> ids(n_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);

  const int64_t slot = n_kv_heads * head_dim;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  pool.k.assign(n_blocks * block_size * slot, nan);
  pool.v.assign(pool.k.size(), nan);
  size_t next = 0;
  for (const int64_t len : lengths) {
    std::vector<int32_t> table;
    for (int64_t b = 0; b < (len + block_size - 1) / block_size; ++b) table.push_back(ids[next++]);
    for (int64_t p = 0; p < len; ++p) {
      const int64_t at = (table[p / block_size] * block_size + p % block_size) * slot;
      for (int64_t i = 0; i < slot; ++i) {
        pool.k[at + i] = normal(rng);
        pool.v[at + i] = normal(rng);
      }
    }
    std::vector<float> q(len * n_heads * head_dim);
    for (float& x : q) x = q_gain * normal(rng);
    pool.tables.push_back(table);
    pool.queries.push_back(q);
  }
  return pool;
}

// One batch row: sequence `seq`'s queries at positions begin .. begin + q_len - 1.
struct Row {
  int seq;
  int64_t begin, q_len;
};

// threads == 0: a plain serial call; otherwise from inside a team of that many threads.
std::vector<float> run(const Pool& pool, const std::vector<Row>& batch, detail::AttnItemFn item,
                       int threads) {
  const AttnShape& s = pool.shape;
  const int64_t width = s.n_heads * s.head_dim;
  int64_t stride = 1;
  for (const auto& t : pool.tables) stride = std::max<int64_t>(stride, t.size());
  std::vector<int32_t> cu{0}, seq_lens, tables(batch.size() * stride, -1);
  std::vector<float> q;
  for (size_t b = 0; b < batch.size(); ++b) {
    const Row& r = batch[b];
    cu.push_back(static_cast<int32_t>(cu.back() + r.q_len));
    seq_lens.push_back(static_cast<int32_t>(r.begin + r.q_len));
    const auto& table = pool.tables[r.seq];
    std::copy(table.begin(), table.end(), tables.begin() + b * stride);
    const auto& qs = pool.queries[r.seq];
    q.insert(q.end(), qs.begin() + r.begin * width, qs.begin() + (r.begin + r.q_len) * width);
  }
  std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
  const AttnRows rows{static_cast<int64_t>(batch.size()), cu.data(), seq_lens.data(), tables.data(),
                      stride};
  const void* k = s.kv_half ? static_cast<const void*>(pool.k16.data()) : pool.k.data();
  const void* v = s.kv_half ? static_cast<const void*>(pool.v16.data()) : pool.v.data();
  if (threads == 0) {
    detail::paged_attention_with(item, q.data(), k, v, out.data(), rows, s);
  } else {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    detail::paged_attention_with(item, q.data(), k, v, out.data(), rows, s);
  }
  return out;
}

// The pool with its K/V rounded to fp16: both as fp16 (kv_half) and, in `rounded`, as the fp32
// values those fp16 numbers stand for.
Pool half_pool(const Pool& pool, Pool* rounded) {
  Pool half = pool;
  half.shape.kv_half = true;
  *rounded = pool;
  for (size_t i = 0; i < pool.k.size(); ++i) {
    half.k16.push_back(fp32_to_fp16(pool.k[i]));
    half.v16.push_back(fp32_to_fp16(pool.v[i]));
    rounded->k[i] = fp16_to_fp32(half.k16.back());
    rounded->v[i] = fp16_to_fp32(half.v16.back());
  }
  return half;
}

constexpr double kLog2e = 1.4426950408889634;

// Sequence seq's query at `pos` against keys 0..pos (the last shape.window of them when set):
// double scores (soft-capped when shape.softcap is set), explicit softmax over bf16 values
// (each head's sink, when shape.sinks is set, in the denominator);
// `bound` gets each element's tolerance.
std::vector<double> reference(const Pool& pool, int seq, int64_t pos, std::vector<double>* bound) {
  const AttnShape& s = pool.shape;
  const int64_t dim = s.head_dim, slot = s.n_kv_heads * dim, group = s.n_heads / s.n_kv_heads;
  const auto& table = pool.tables[seq];
  const float q_scale = s.scale * 1.4426950408889634f;  // the kernel's scores are in log2 units
  std::vector<double> out(s.n_heads * dim, 0.0), scores(pos + 1);
  bound->assign(s.n_heads * dim, kTolerance);
  for (int64_t h = 0; h < s.n_heads; ++h) {
    const float* q = pool.queries[seq].data() + (pos * s.n_heads + h) * dim;
    const int64_t kv = h / group;
    auto at = [&](int64_t p) {
      return (table[p / s.block_size] * s.block_size + p % s.block_size) * slot + kv * dim;
    };
    const int64_t first = s.window > 0 ? std::max<int64_t>(0, pos - s.window + 1) : 0;
    double max = -INFINITY, sum = 0.0;
    for (int64_t p = first; p <= pos; ++p) {
      double dot = 0.0;
      for (int64_t d = 0; d < dim; ++d) {
        dot += static_cast<double>(q[d] * q_scale) * pool.k[at(p) + d];
      }
      scores[p] = dot;
      if (s.softcap > 0.0f) {
        const double cap = static_cast<double>(s.softcap) * 1.4426950408889634;  // log2 units
        scores[p] = cap * std::tanh(scores[p] / cap);
      }
      max = std::max(max, scores[p]);
    }
    for (int64_t p = first; p <= pos; ++p) sum += std::exp2(scores[p] - max);
    // A sink (gpt-oss) joins the denominator with no value: the weights sum to less than 1.
    if (s.sinks != nullptr) sum += std::exp2(static_cast<double>(s.sinks[h]) * kLog2e - max);
    for (int64_t p = first; p <= pos; ++p) {
      const double w = std::exp2(scores[p] - max) / sum;
      for (int64_t d = 0; d < dim; ++d) {
        const double value = bf16(pool.v[at(p) + d]);
        out[h * dim + d] += w * value;
        (*bound)[h * dim + d] =
            std::max((*bound)[h * dim + d], kTolerance + kWeightRounding * std::fabs(value));
      }
    }
  }
  return out;
}

void expect_matches_reference(const Pool& pool, const std::vector<Row>& batch,
                              const std::vector<float>& out, const char* path) {
  const int64_t width = pool.shape.n_heads * pool.shape.head_dim;
  int64_t token = 0;
  for (const Row& r : batch) {
    for (int64_t pos = r.begin; pos < r.begin + r.q_len; ++pos, ++token) {
      std::vector<double> bound;
      const std::vector<double> want = reference(pool, r.seq, pos, &bound);
      for (int64_t i = 0; i < width; ++i) {
        const float got = out[token * width + i];
        ASSERT_TRUE(std::isfinite(got)) << path << " seq " << r.seq << " pos " << pos << " i " << i;
        ASSERT_NEAR(got, want[i], bound[i])
            << path << " seq " << r.seq << " pos " << pos << " i " << i;
      }
    }
  }
}

// Bitwise equality of the queries' output rows; `a_token` and `b_token` index rows of a and b.
void expect_same_bits(const std::vector<float>& a, int64_t a_token, const std::vector<float>& b,
                      int64_t b_token, int64_t width, const char* what) {
  EXPECT_EQ(
      0, std::memcmp(a.data() + a_token * width, b.data() + b_token * width, width * sizeof(float)))
      << what << ": token " << a_token << " vs " << b_token;
}

struct Case {
  int64_t n_heads, n_kv_heads, head_dim, block_size;
};

class PagedAttention : public ::testing::TestWithParam<Case> {};

TEST_P(PagedAttention, MatchesReferenceOnEveryPath) {
  const Case c = GetParam();
  // Lengths: a single token, a partial block, exact blocks, and a long row.
  const Pool pool =
      make_pool(c.n_heads, c.n_kv_heads, c.head_dim, c.block_size, {1, 37, 100, 16, 33, 230}, 2.0f,
                static_cast<uint32_t>(c.head_dim * 10 + c.n_heads));
  const std::vector<Row> batch = {
      {2, 99, 1},    // decode row
      {1, 0, 37},    // prefill from position 0
      {4, 20, 13},   // continuation chunk after earlier context
      {0, 0, 1},     // the very first token
      {3, 15, 1},    // decode that fills a block exactly
      {5, 150, 80},  // long continuation
  };
  for (const detail::AttnPath& path : detail::attention_paths()) {
    expect_matches_reference(pool, batch, run(pool, batch, path.fn, 0), path.name);
    expect_matches_reference(pool, batch, run(pool, batch, path.fn, 2), path.name);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttention,
                         ::testing::Values(Case{4, 4, 64, 16}, Case{9, 3, 64, 16},
                                           Case{8, 8, 128, 16}, Case{6, 2, 128, 16},
                                           Case{6, 3, 72, 8}, Case{9, 3, 64, 32}));

TEST(PagedAttentionLong, DecodeAt8192MatchesReference) {
  // Peaked scores (q scaled up) make the running max move late in the context as well.
  const Pool pool = make_pool(9, 3, 64, 16, {8192}, 4.0f, 3);
  const std::vector<Row> batch = {{0, 8191, 1}, {0, 4000, 1}};
  for (const detail::AttnPath& path : detail::attention_paths()) {
    expect_matches_reference(pool, batch, run(pool, batch, path.fn, 2), path.name);
  }
}

TEST(PagedAttentionHalf, Fp16PoolGivesTheBitsOfAnFp32PoolHoldingTheSameValues) {
  // Block sizes 16 and 8, head_dim 64 and 72 (a tail past the vector width), prefill and decode.
  for (const Case c : {Case{9, 3, 64, 16}, Case{6, 3, 72, 8}}) {
    const Pool pool =
        make_pool(c.n_heads, c.n_kv_heads, c.head_dim, c.block_size, {70, 33}, 2.0f, 17);
    Pool rounded;
    const Pool half = half_pool(pool, &rounded);
    const std::vector<Row> batch = {{0, 0, 70}, {1, 32, 1}, {1, 10, 5}};
    for (const detail::AttnPath& path : detail::attention_paths()) {
      const auto want = run(rounded, batch, path.fn, 0);
      for (const int threads : {0, 2}) {
        const auto got = run(half, batch, path.fn, threads);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
            << path.name << " head_dim " << c.head_dim << " threads " << threads;
      }
      expect_matches_reference(rounded, batch, want, path.name);
    }
  }
}

// Every path rounds the same operations in the same order (attention_item.inc), VDPBF16PS
// included, so on finite, normal data every path gives the portable path's bits.
TEST(PagedAttentionPaths, EveryPathGivesThePortableBits) {
  for (const Case c : {Case{9, 3, 64, 16}, Case{6, 3, 72, 8}, Case{8, 8, 128, 16}}) {
    const Pool pool = make_pool(c.n_heads, c.n_kv_heads, c.head_dim, c.block_size, {150, 37, 80},
                                3.0f, static_cast<uint32_t>(c.n_heads));
    Pool rounded;
    const Pool half = half_pool(pool, &rounded);
    const std::vector<Row> batch = {{0, 0, 150}, {1, 36, 1}, {2, 50, 30}};
    for (const int64_t window : {int64_t{0}, int64_t{21}}) {
      for (Pool p : {pool, half}) {
        p.shape.window = window;
        const auto want = run(p, batch, detail::attention_paths().front().fn, 0);
        for (const detail::AttnPath& path : detail::attention_paths()) {
          const auto got = run(p, batch, path.fn, 2);
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
              << path.name << " head_dim " << c.head_dim << " window " << window << " fp16 "
              << p.shape.kv_half;
        }
      }
    }
  }
}

TEST(PagedAttentionPublic, UsesTheFastestPath) {
  const Pool pool = make_pool(9, 3, 64, 16, {70}, 1.0f, 5);
  const std::vector<Row> batch = {{0, 0, 70}};
  const auto want = run(pool, batch, detail::attention_paths().back().fn, 0);
  std::vector<int32_t> cu{0, 70}, seq_lens{70};
  std::vector<float> out(want.size());
  const AttnRows rows{1, cu.data(), seq_lens.data(), pool.tables[0].data(),
                      static_cast<int64_t>(pool.tables[0].size())};
  paged_attention(pool.queries[0].data(), pool.k.data(), pool.v.data(), out.data(), rows,
                  pool.shape);
  EXPECT_EQ(0, std::memcmp(out.data(), want.data(), out.size() * sizeof(float)));
}

TEST(PagedAttentionInvariance, SameBitsInAnyBatchRowShapeOrThreadCount) {
  const Pool pool = make_pool(9, 3, 64, 16, {100, 60, 300}, 2.0f, 11);
  const int64_t width = 9 * 64;
  for (const detail::AttnPath& path : detail::attention_paths()) {
    // The baseline: sequence 0 prefilled in one row, serially.
    const auto prefill = run(pool, {{0, 0, 100}}, path.fn, 0);
    const std::vector<int64_t> positions = {0, 1, 15, 16, 17, 50, 99};
    for (const int64_t pos : positions) {
      const auto alone = run(pool, {{0, pos, 1}}, path.fn, 0);
      expect_same_bits(alone, 0, prefill, pos, width, "decode row alone");
    }
    // The same decode rows among other rows (a prefill, other decodes), on one and two threads.
    std::vector<Row> mixed = {{1, 0, 60}, {2, 299, 1}};
    for (const int64_t pos : positions) mixed.push_back({0, pos, 1});
    mixed.push_back({2, 200, 50});
    const std::vector<float> serial = run(pool, mixed, path.fn, 0);
    for (const int threads : {1, 2}) {
      const std::vector<float> team = run(pool, mixed, path.fn, threads);
      EXPECT_EQ(0, std::memcmp(team.data(), serial.data(), serial.size() * sizeof(float)))
          << path.name << " threads " << threads;
    }
    for (size_t i = 0; i < positions.size(); ++i) {
      expect_same_bits(serial, 61 + i, prefill, positions[i], width, "decode row in a batch");
    }
    // A continuation chunk gives the same bits as the same tokens inside the full prefill.
    const auto chunk = run(pool, {{2, 0, 7}, {0, 40, 60}}, path.fn, 2);
    for (int64_t t = 0; t < 60; ++t) {
      expect_same_bits(chunk, 7 + t, prefill, 40 + t, width, "continuation chunk");
    }
  }
}

// Tiles of consecutive queries (attention_internal.h): every query of every chunk below, whatever
// its offset in a tile, a tile cut short by the row's end or a tile straddling a block boundary,
// must give the bits of the same query run alone as a decode row (a tile of one, split per head).
TEST(PagedAttentionInvariance, TilesKeepEachQuerysBits) {
  for (const Case c : {Case{9, 3, 64, 16}, Case{6, 3, 72, 8}, Case{4, 2, 64, 32}}) {
    Pool pool = make_pool(c.n_heads, c.n_kv_heads, c.head_dim, c.block_size, {1}, 2.0f, 1);
    const int64_t tile = detail::attn_tile_queries(pool.shape);
    const int64_t length = 3 * tile + 2 * c.block_size + 5;
    pool = make_pool(c.n_heads, c.n_kv_heads, c.head_dim, c.block_size, {length}, 2.0f,
                     static_cast<uint32_t>(c.block_size));
    const int64_t width = c.n_heads * c.head_dim;
    // Chunks starting at several offsets of a query tile and of a key tile (kKeyTile), lengths
    // not a multiple of either.
    std::vector<std::pair<int64_t, int64_t>> chunks = {{0, length}};
    for (const int64_t begin :
         {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, tile - 1, tile, detail::kKeyTile - 3}) {
      chunks.push_back({begin, length - begin});
      chunks.push_back({c.block_size - begin % c.block_size, tile + 3});
    }
    for (const detail::AttnPath& path : detail::attention_paths()) {
      std::vector<std::vector<float>> alone(length);
      for (int64_t pos = 0; pos < length; ++pos) alone[pos] = run(pool, {{0, pos, 1}}, path.fn, 0);
      for (const auto& [begin, q_len] : chunks) {
        for (const int threads : {0, 2}) {
          // The chunk next to a decode row, which must not change either of them.
          const auto out = run(pool, {{0, length - 1, 1}, {0, begin, q_len}}, path.fn, threads);
          expect_same_bits(out, 0, alone[length - 1], 0, width, path.name);
          for (int64_t t = 0; t < q_len; ++t) {
            expect_same_bits(out, 1 + t, alone[begin + t], 0, width, path.name);
          }
        }
      }
    }
  }
}

// Decode rows take a kernel of their own on the SIMD paths (attention_decode.inc): each must give
// the bits of the same query inside a prefill row, on every path, and the portable path's bits,
// at key counts around the 64-key tiles (1, 63, 64, 65, 128, 129, 300, 301), in fp32 and fp16
// pools, with windows and soft-caps, for groups of 1, 3, 4 and 7 heads (the kernel takes up to 4
// heads per pass).
TEST(PagedAttentionDecode, DecodeRowsGiveTheirPrefillBitsOnEveryPath) {
  const int64_t length = 301;
  const std::vector<int64_t> positions = {0, 62, 63, 64, 65, 127, 128, 299, 300};
  for (const Case c :
       {Case{9, 3, 64, 16}, Case{4, 4, 64, 16}, Case{8, 2, 128, 16}, Case{14, 2, 64, 32}}) {
    const Pool fp32 = make_pool(c.n_heads, c.n_kv_heads, c.head_dim, c.block_size, {length}, 3.0f,
                                static_cast<uint32_t>(c.n_heads * 7 + c.head_dim));
    Pool rounded;
    const Pool fp16 = half_pool(fp32, &rounded);
    const int64_t width = c.n_heads * c.head_dim;
    std::vector<Row> decodes;
    for (const int64_t pos : positions) decodes.push_back({0, pos, 1});
    // (window, soft-cap): neither, a window inside a tile, a tile-long window with a cap.
    for (const auto& [window, cap] : {std::pair<int64_t, float>{0, 0.0f}, {21, 0.0f}, {64, 5.0f}}) {
      for (Pool pool : {fp32, fp16}) {
        pool.shape.window = window;
        pool.shape.softcap = cap;
        SCOPED_TRACE(testing::Message()
                     << "heads " << c.n_heads << "/" << c.n_kv_heads << " dim " << c.head_dim
                     << " window " << window << " cap " << cap << " fp16 " << pool.shape.kv_half);
        const auto portable = run(pool, {{0, 0, length}}, detail::attention_paths().front().fn, 0);
        for (const detail::AttnPath& path : detail::attention_paths()) {
          const auto prefill = run(pool, {{0, 0, length}}, path.fn, 2);
          const auto decoded = run(pool, decodes, path.fn, 2);
          for (size_t i = 0; i < positions.size(); ++i) {
            expect_same_bits(decoded, i, prefill, positions[i], width, path.name);
            expect_same_bits(decoded, i, portable, positions[i], width, path.name);
          }
        }
      }
    }
  }
}

// A block of the pool no sequence owns (all NaN).
int32_t spare_block(const Pool& pool) {
  const int64_t n_blocks = static_cast<int64_t>(pool.k.size()) /
                           (pool.shape.block_size * pool.shape.n_kv_heads * pool.shape.head_dim);
  std::vector<bool> owned(n_blocks, false);
  for (const auto& table : pool.tables) {
    for (const int32_t id : table) owned[id] = true;
  }
  return static_cast<int32_t>(std::find(owned.begin(), owned.end(), false) - owned.begin());
}

// The blocks wholly before the window of row r's first query point at a NaN block: reading one
// poisons the output (each row below has its own sequence).
Pool poison_before_windows(Pool pool, const std::vector<Row>& batch) {
  const int32_t spare = spare_block(pool);
  for (const Row& r : batch) {
    const int64_t first_key = std::max<int64_t>(0, r.begin - pool.shape.window + 1);
    for (int64_t b = 0; b < first_key / pool.shape.block_size; ++b) pool.tables[r.seq][b] = spare;
  }
  return pool;
}

TEST(PagedAttentionWindow, MatchesReferenceOnEveryPath) {
  for (const Case c : {Case{9, 3, 64, 16}, Case{6, 3, 72, 8}}) {
    const Pool full = make_pool(c.n_heads, c.n_kv_heads, c.head_dim, c.block_size,
                                {1, 37, 100, 33, 230}, 2.0f, static_cast<uint32_t>(c.head_dim));
    const std::vector<Row> batch = {
        {2, 99, 1},    // decode row
        {1, 0, 37},    // prefill from position 0
        {3, 20, 13},   // continuation chunk after earlier context
        {0, 0, 1},     // the very first token
        {4, 150, 80},  // long continuation
    };
    // Windows of one key, shorter than a tile, one block, past a block, longer than a prefill.
    for (const int64_t window :
         {int64_t{1}, int64_t{5}, c.block_size, c.block_size + 3, int64_t{40}, int64_t{1000}}) {
      Pool pool = full;
      pool.shape.window = window;
      pool = poison_before_windows(pool, batch);
      for (const detail::AttnPath& path : detail::attention_paths()) {
        for (const int threads : {0, 2}) {
          SCOPED_TRACE(testing::Message() << "window " << window << " threads " << threads);
          expect_matches_reference(pool, batch, run(pool, batch, path.fn, threads), path.name);
        }
      }
    }
  }
}

// Gemma 2's soft-capped scores, with and without a window: peaked queries (gain 4) push scores
// well past the caps, where tanh flattens them.
TEST(PagedAttentionSoftcap, MatchesReferenceOnEveryPath) {
  const Pool full = make_pool(8, 4, 32, 16, {40, 70}, 4.0f, 11);
  const std::vector<Row> batch = {{0, 39, 1}, {1, 10, 60}};
  for (const float cap : {1.0f, 5.0f}) {
    for (const int64_t window : {int64_t{0}, int64_t{9}}) {
      Pool pool = full;
      pool.shape.softcap = cap;
      pool.shape.window = window;
      const auto portable = run(pool, batch, detail::attention_paths().front().fn, 0);
      for (const detail::AttnPath& path : detail::attention_paths()) {
        SCOPED_TRACE(testing::Message() << "cap " << cap << " window " << window);
        const auto got = run(pool, batch, path.fn, 2);
        expect_matches_reference(pool, batch, got, path.name);
        EXPECT_EQ(0, std::memcmp(got.data(), portable.data(), got.size() * sizeof(float)));
      }
    }
  }
}

// Under a window, as without one: each query of a chunk gives the bits of the same query alone.
TEST(PagedAttentionWindow, TilesKeepEachQuerysBits) {
  const Case c{9, 3, 64, 16};
  const int64_t length = 3 * (detail::kAttnRows / 3) + 2 * c.block_size + 5;
  Pool pool = make_pool(c.n_heads, c.n_kv_heads, c.head_dim, c.block_size, {length}, 2.0f, 23);
  const int64_t width = c.n_heads * c.head_dim;
  for (const int64_t window : {int64_t{3}, int64_t{20}}) {
    pool.shape.window = window;
    for (const detail::AttnPath& path : detail::attention_paths()) {
      std::vector<std::vector<float>> alone(length);
      for (int64_t pos = 0; pos < length; ++pos) alone[pos] = run(pool, {{0, pos, 1}}, path.fn, 0);
      for (const int64_t begin : {int64_t{0}, int64_t{3}, c.block_size - 1}) {
        for (const int threads : {0, 2}) {
          const auto out = run(pool, {{0, begin, length - begin}}, path.fn, threads);
          for (int64_t t = 0; t < length - begin; ++t) {
            expect_same_bits(out, t, alone[begin + t], 0, width, path.name);
          }
        }
      }
    }
  }
}

// gpt-oss's sinks (one per query head: below, about and far above the scores; the last one
// outweighs every key, so its head's output is 0), with and without a window, fp32 and fp16
// pools: every path matches the reference and gives the portable bits, and decode rows give
// their prefill bits.
TEST(PagedAttentionSinks, MatchesReferenceOnEveryPathWithThePortableBits) {
  const std::vector<float> sinks = {-3.0f, 0.0f, 1.5f, 4.0f, -0.5f, 8.0f, 0.25f, 500.0f};
  const Pool fp32 = make_pool(8, 2, 64, 16, {40, 70, 130}, 2.0f, 23);
  Pool rounded;
  const Pool fp16 = half_pool(fp32, &rounded);
  const std::vector<Row> batch = {{0, 39, 1}, {1, 10, 60}, {2, 0, 130}};
  const std::vector<int64_t> positions = {0, 63, 64, 129};
  std::vector<Row> decodes;
  for (const int64_t pos : positions) decodes.push_back({2, pos, 1});
  const int64_t width = 8 * 64;
  for (const int64_t window : {int64_t{0}, int64_t{9}}) {
    for (Pool pool : {fp32, fp16}) {
      Pool values = pool.shape.kv_half ? rounded : pool;  // the reference reads fp32
      for (Pool* p : {&pool, &values}) {
        p->shape.sinks = sinks.data();
        p->shape.window = window;
      }
      SCOPED_TRACE(testing::Message() << "window " << window << " fp16 " << pool.shape.kv_half);
      const auto portable = run(pool, batch, detail::attention_paths().front().fn, 0);
      const auto whole = run(pool, {{2, 0, 130}}, detail::attention_paths().front().fn, 0);
      for (const detail::AttnPath& path : detail::attention_paths()) {
        const auto got = run(pool, batch, path.fn, 2);
        expect_matches_reference(values, batch, got, path.name);
        EXPECT_EQ(0, std::memcmp(got.data(), portable.data(), got.size() * sizeof(float)))
            << path.name;
        const auto decoded = run(pool, decodes, path.fn, 2);
        for (size_t i = 0; i < positions.size(); ++i) {
          expect_same_bits(decoded, i, whole, positions[i], width, path.name);
        }
        for (int64_t d = 0; d < 64; ++d) EXPECT_EQ(got[7 * 64 + d], 0.0f) << path.name;
      }
    }
  }
}

}  // namespace
}  // namespace met::cpu
