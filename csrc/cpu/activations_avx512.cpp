// The gated activations (activations.inc) built for AVX-512 registers; ops.h activations_for.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/ops.h"

namespace met::cpu {
namespace {

#include "cpu/activations.inc"

}  // namespace

const Activations& activations_avx512() { return kActivations; }

}  // namespace met::cpu
