// Owns: the one choice of SIMD path for every CPU kernel (quantized matmul, attention, activation
//   quantization, fp16 widening): what the running CPU (and, for AMX, its kernel) allows, the
//   MET_CPU_ISA environment variable that forces a path, and the process-wide path in use.
// Called by: quant_matmul.cpp, attention.cpp, llama_forward.cpp, csrc/bindings/cpu_kernels.cpp
//   (_core.cpu.cpu_path / set_cpu_path, `met doctor`) and the tests, which run each path the CPU
//   supports.
// Invariants: a path is a ceiling: each kernel takes its best variant at or below it (an AVX-512
//   CPU without VNNI runs the avx512 path's matmul on AVX2 code). Forcing a path the CPU cannot run
//   is an error, never a silent fallback. A LlamaForward reads the path once, at construction.
#pragma once

#include <cstdint>
#include <string>

namespace met::cpu {

enum class CpuPath : int32_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

constexpr CpuPath kAllPaths[] = {CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512, CpuPath::kAmx};

const char* path_name(CpuPath path);
// Throws std::invalid_argument for a name other than scalar, avx2, avx512 or amx.
CpuPath parse_path(const std::string& name);

struct CpuFeatures;

// Empty when this CPU can run `path`; otherwise why not ("this CPU lacks avx512f", "the kernel
// refused AMX tile data (arch_prctl)"). AMX asks the kernel for tile permission once.
std::string path_unsupported_reason(CpuPath path);
inline bool path_supported(CpuPath path) { return path_unsupported_reason(path).empty(); }
// The same for a CPU with `features`, with or without emulated AMX tiles: pure, for tests.
std::string path_unsupported_reason_for(CpuPath path, const CpuFeatures& features,
                                        bool amx_emulated);

// The path taken when MET_CPU_ISA is unset: the fastest this CPU supports (never the emulated
// tiles, a testing hook).
CpuPath best_path();
// best_path's choice for a CPU with `features`: pure, so tests can hand it any CPU.
CpuPath default_path_for(const CpuFeatures& features);

// MET_CPU_ISA when set, else best_path(); then whatever set_active_path chose last. Throws
// std::runtime_error when MET_CPU_ISA names an unknown or unsupported path.
CpuPath active_path();
// Throws std::runtime_error when the CPU cannot run `path`.
void set_active_path(CpuPath path);

// Testing hook: while on, the amx path runs its tile kernels on a scalar emulation of the tile
// instructions (quant_matmul_amx_emulated.cpp) and is supported wherever AVX-512 VNNI is, so a
// CPU without AMX tests the amx path's packing, blocking and epilogue. Off unless a test sets it;
// forwards built while it is on keep it.
void set_amx_emulation(bool on);
bool amx_emulation();

// The individual CPU features behind the paths (cpuid, plus the OS's consent for AMX).
struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false;
  bool avx512bf16 = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
  bool amx_permitted = false;  // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) succeeded
};
const CpuFeatures& cpu_features();

}  // namespace met::cpu
