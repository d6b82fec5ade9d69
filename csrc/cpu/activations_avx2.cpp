// The gated activations (activations.inc) built for AVX2 registers; ops.h activations_for.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/ops.h"

namespace met::cpu {
namespace {

#include "cpu/activations.inc"

}  // namespace

const Activations& activations_avx2() { return kActivations; }

}  // namespace met::cpu
