// One 64-bit mixing step shared by the prefix cache's block hashes and the n-gram proposer.
// Owns: nothing (a pure function). Called by: block_manager.cpp, ngram_proposer.cpp.
#pragma once

#include <cstdint>

namespace met {

// splitmix64's finalizer: a bijection with full avalanche, so every token bit reaches every hash
// bit and chaining through it cannot collapse two different parents into one state.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace met
