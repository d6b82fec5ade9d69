// cpu::draw, the host's draw, against kernels::ref::sample (the sort-based reference of the GPU
// kernel's semantics): the same token on every row, parameter set and awkward logits row, on
// every CPU path this machine runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cpu/isa.h"
#include "cpu/sampling.h"
#include "kernels/reference/kernel_refs.h"

namespace met {
namespace {

int32_t reference(const std::vector<float>& logits, const cpu::DrawParams& p) {
  const kernels::ref::SampleParams ref{p.temperature, p.top_k, p.top_p, p.min_p, p.seed, p.step};
  return kernels::ref::sample(logits.data(), static_cast<int32_t>(logits.size()), ref);
}

// Rows of the shapes that stress each stage: spread and peaked logits, ties at the top-k and
// top-p boundaries, NaN and -inf entries, a huge vocabulary's long tail.
std::vector<std::vector<float>> rows(std::mt19937& rng) {
  std::vector<std::vector<float>> out;
  for (const int vocab : {5, 200, 4099}) {
    for (const float scale : {0.5f, 2.5f, 8.0f}) {
      std::normal_distribution<float> dist(0.0f, scale);
      std::vector<float> v(vocab);
      for (float& x : v) x = dist(rng);
      out.push_back(v);
      std::vector<float> tied = v;  // a block of equal values across every boundary
      for (int i = 0; i < vocab / 2; i += 2) tied[i] = 1.0f;
      out.push_back(tied);
      std::vector<float> odd = v;
      odd[0] = std::numeric_limits<float>::quiet_NaN();
      odd[vocab - 1] = -std::numeric_limits<float>::infinity();
      out.push_back(odd);
    }
  }
  return out;
}

// Runs `body` once on each CPU path this machine supports, then restores the path.
template <typename Body>
void on_every_path(Body body) {
  const cpu::CpuPath before = cpu::active_path();
  for (const cpu::CpuPath path : cpu::kAllPaths) {
    if (!cpu::path_supported(path)) continue;
    SCOPED_TRACE(cpu::path_name(path));
    cpu::set_active_path(path);
    body();
  }
  cpu::set_active_path(before);
}

TEST(CpuDraw, EqualsTheKernelReferenceOnEveryRowAndParameterSet) {
  on_every_path([] {
    std::mt19937 rng(11);
    const cpu::DrawParams settings[] = {
        {1.0f, 0, 1.0f, 0.0f, 1, 0},   {0.7f, 5, 1.0f, 0.0f, 2, 0},
        {1.3f, 0, 0.8f, 0.0f, 3, 0},   {1.0f, 0, 1.0f, 0.1f, 4, 0},
        {0.9f, 20, 0.5f, 0.05f, 5, 0}, {0.0f, 0, 1.0f, 0.0f, 6, 0},
        {1.0f, 1, 0.9f, 0.0f, 7, 0},   {2.0f, 3, 0.3f, 0.0f, 8, 0},
        {1.0f, 0, 0.0f, 0.0f, 9, 0},   {0.6f, 9999, 0.99f, 0.0f, 10, 0},
        {5.0f, 0, 1.0f, 0.0f, 11, 0}};
    int compared = 0;
    for (const std::vector<float>& logits : rows(rng)) {
      for (cpu::DrawParams p : settings) {
        for (uint64_t step = 0; step < 12; ++step, ++compared) {
          p.step = step;
          ASSERT_EQ(cpu::draw(logits.data(), static_cast<int32_t>(logits.size()), p),
                    reference(logits, p))
              << "vocab " << logits.size() << " temperature " << p.temperature << " top_k "
              << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p << " step " << step;
        }
      }
    }
    EXPECT_EQ(compared, 27 * 11 * 12);
  });
}

TEST(CpuDraw, NothingDrawableGivesTokenZeroAndGreedyIsTheFirstLargest) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> dead = {-inf, std::numeric_limits<float>::quiet_NaN(), -inf};
  EXPECT_EQ(cpu::draw(dead.data(), 3, {1.0f, 0, 1.0f, 0.0f, 1, 0}), 0);
  const std::vector<float> tied = {1.0f, 3.0f, 3.0f, 2.0f};
  EXPECT_EQ(cpu::draw(tied.data(), 4, {0.0f, 0, 1.0f, 0.0f, 1, 0}), 1);
  EXPECT_EQ(cpu::draw(tied.data(), 4, {1.0f, 1, 1.0f, 0.0f, 1, 0}), 1);
}

TEST(CpuDraw, ATokenOfNegligibleProbabilityIsNeverDrawn) {
  // Token 0 holds all but e^-40 of the mass: no noise may lift another above it.
  std::vector<float> logits(4096, -40.0f);
  logits[0] = 0.0f;
  on_every_path([&] {
    for (uint64_t step = 0; step < 2000; ++step) {
      ASSERT_EQ(cpu::draw(logits.data(), 4096, {1.0f, 0, 1.0f, 0.0f, 3, step}), 0) << step;
    }
  });
}

}  // namespace
}  // namespace met
