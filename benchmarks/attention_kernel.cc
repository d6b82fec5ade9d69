// The decode attention kernel alone: B sequences of C keys each, one query per sequence, the
// default model's shape (9 query heads, 3 kv heads, head_dim 64, blocks of 16, fp16 pool), over
// paged_attention_with from inside a team of THREADS threads (default 2); prints the best wall
// time of R calls. Not part of the build; compile it against a checkout's csrc, e.g.
//
//   S=csrc; O=/tmp/attn; mkdir -p $O; F="-O3 -std=c++17 -fopenmp -I$S -ffp-contract=off"
//   g++ $F -c $S/cpu/attention.cpp -o $O/a.o
//   g++ $F -mavx2 -mfma -mf16c -c $S/cpu/attention_avx2.cpp -o $O/b.o
//   g++ $F -mavx2 -mfma -mavx512f -mprefer-vector-width=512 -c $S/cpu/attention_avx512.cpp -o
//   $O/c.o
//   g++ $F -mavx2 -mfma -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mprefer-vector-width=512 \
//       -c $S/cpu/attention_avx512bf16.cpp -o $O/d.o
//   g++ $F -c $S/cpu/isa.cpp -o $O/e.o && g++ $F -c $S/cpu/half.cpp -o $O/f.o
//   g++ $F benchmarks/attention_kernel.cc $O/*.o -o $O/attention_kernel
//   $O/attention_kernel 32 300 avx512 200     # B C path R
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cpu/attention.h"
#include "cpu/attention_internal.h"
#include "cpu/isa.h"

using namespace met::cpu;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s SEQUENCES KEYS scalar|avx2|avx512 CALLS\n", argv[0]);
    return 2;
  }
  const int n_rows = std::atoi(argv[1]), ctx = std::atoi(argv[2]), calls = std::atoi(argv[4]);
  const CpuPath path = parse_path(argv[3]);
  const int threads = std::getenv("THREADS") ? std::atoi(std::getenv("THREADS")) : 2;
  const int heads = 9, kv_heads = 3, dim = 64, block = 16;
  const int per_row = (ctx + block - 1) / block, n_blocks = per_row * n_rows;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  // fp16 values near +-1 (random sign and mantissa bits).
  std::vector<uint16_t> k(size_t(n_blocks) * block * kv_heads * dim), v(k.size());
  for (auto& x : k) x = 0x3C00 ^ (rng() & 0x83FF);
  for (auto& x : v) x = 0x3C00 ^ (rng() & 0x83FF);
  std::vector<float> q(size_t(n_rows) * heads * dim), out(q.size());
  for (auto& x : q) x = normal(rng);
  std::vector<int32_t> table(n_blocks), cu(n_rows + 1), lens(n_rows, ctx);
  for (int i = 0; i < n_blocks; ++i) table[i] = i;
  for (int i = 0; i <= n_rows; ++i) cu[i] = i;
  const AttnRows rows{n_rows, cu.data(), lens.data(), table.data(), per_row};
  AttnShape shape{heads, kv_heads, dim, block, 1.0f / 8};
  shape.kv_half = true;
  const detail::AttnItemFn item = detail::attention_item_for(path);
  double best = 1e9;
  for (int r = 0; r < calls; ++r) {
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    detail::paged_attention_with(item, q.data(), k.data(), v.data(), out.data(), rows, shape);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  std::printf("decode %d sequences x %d keys, %s, %d threads: %.3f ms per layer\n", n_rows, ctx,
              argv[3], threads, best * 1e3);
}
