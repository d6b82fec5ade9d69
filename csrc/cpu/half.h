// Owns: IEEE 754 binary16 (fp16) <-> float32 conversion in portable code.
// Called by: the quantized matmul (block scales), the CPU forward's fp16 KV store and the
//   portable attention path's fp16 KV reads; tests/cpp/test_half.cc checks every fp16 value.
// Invariants: fp16_to_fp32 is exact; fp32_to_fp16 rounds to nearest, ties to even (what F16C's
//   vcvtps2ph and torch's .half() do), overflows to infinity and keeps NaN a NaN.
#pragma once

#include <cstdint>

namespace met::cpu {

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);

}  // namespace met::cpu
