// Owns: the names of the CPU kernels' enums as Python passes them, shared by the CPU binding
//   files (cpu_kernels.cpp, cpu_model.cpp).
#pragma once

#include <string>

#include "cpu/quant_matmul.h"

namespace met::bindings {

// "Q8_0" | "Q4_0" | "Q4_1" | "Q5_0" | "Q5_1" | "MXFP4" | "IQ4_NL" | "Q2_K" | "Q3_K" | "Q4_K" |
// "Q5_K" | "Q6_K" | "IQ4_XS"; raises ValueError otherwise.
cpu::QType parse_qtype(const std::string& name);

}  // namespace met::bindings
