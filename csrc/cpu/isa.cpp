// CPU feature detection and the process-wide kernel path (isa.h).
#include "isa.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define MET_X86 1
#endif
#if defined(MET_X86) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace met::cpu {

namespace {

#if defined(MET_X86) && defined(__linux__)
// Linux 5.16+: a process must ask before its threads may use AMX tile data (the 8 KiB of state
// the kernel otherwise does not save). Refused on older kernels and in some VMs.
bool request_amx_permission() {
  constexpr long kArchGetXcompPerm = 0x1022;
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0) return false;
  return (granted >> kXfeatureXtiledata) & 1u;
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#ifdef MET_X86
  // __builtin_cpu_supports also checks that the OS saves the AVX / AVX-512 registers.
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = __builtin_cpu_supports("f16c");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    f.amx_bf16 = (edx >> 22) & 1u;
    f.amx_tile = (edx >> 24) & 1u;
    f.amx_int8 = (edx >> 25) & 1u;
  }
  if (f.avx512f && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) f.avx512bf16 = (eax >> 5) & 1u;
#ifdef __linux__
  f.amx_permitted = f.amx_tile && f.amx_int8 && request_amx_permission();
#endif
#endif
  return f;
}

std::string lacks(const char* feature) { return std::string("this CPU lacks ") + feature; }

std::atomic<int> g_active{-1};  // -1: not chosen yet
std::atomic<bool> g_amx_emulation{false};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

const char* path_name(CpuPath path) {
  switch (path) {
    case CpuPath::kScalar:
      return "scalar";
    case CpuPath::kAvx2:
      return "avx2";
    case CpuPath::kAvx512:
      return "avx512";
    case CpuPath::kAmx:
      return "amx";
  }
  return "unknown";
}

CpuPath parse_path(const std::string& name) {
  for (const CpuPath path : kAllPaths) {
    if (name == path_name(path)) return path;
  }
  throw std::invalid_argument("MET_CPU_ISA must be scalar, avx2, avx512 or amx, not '" + name +
                              "'");
}

std::string path_unsupported_reason_for(CpuPath path, const CpuFeatures& f, bool amx_emulated) {
  switch (path) {
    case CpuPath::kScalar:
      return "";
    case CpuPath::kAmx:
      if (amx_emulated) {
        if (!f.avx512vnni || !f.avx512vl || !f.avx512bw) {
          return lacks("avx512vnni/avx512vl/avx512bw (for emulated AMX tiles)");
        }
      } else if (!f.amx_tile || !f.amx_int8) {
        return lacks("amx_tile/amx_int8");
      } else if (!f.amx_permitted) {
        return "the kernel refused AMX tile data (arch_prctl XTILEDATA)";
      }
      [[fallthrough]];
    case CpuPath::kAvx512:
      if (!f.avx512f) return lacks("avx512f");
      [[fallthrough]];
    case CpuPath::kAvx2:
      if (!f.avx2 || !f.fma || !f.f16c) return lacks("avx2/fma/f16c");
      return "";
  }
  return "unknown path";
}

std::string path_unsupported_reason(CpuPath path) {
  return path_unsupported_reason_for(path, cpu_features(), amx_emulation());
}

// amx leads: its full-density tiles beat the avx512 path's VNNI kernel on AMX hardware at every
// M (benchmarks/README.md, "AMX-INT8 tiles"); the tile kernel before them, which reproduced the
// VNNI kernel's partial dots, was slower, and while it was amx was left out of this choice.
CpuPath default_path_for(const CpuFeatures& features) {
  for (const CpuPath path : {CpuPath::kAmx, CpuPath::kAvx512, CpuPath::kAvx2}) {
    if (path_unsupported_reason_for(path, features, false).empty()) return path;
  }
  return CpuPath::kScalar;
}

CpuPath best_path() {
  static const CpuPath best = default_path_for(cpu_features());
  return best;
}

CpuPath active_path() {
  int current = g_active.load(std::memory_order_acquire);
  if (current >= 0) return static_cast<CpuPath>(current);
  CpuPath chosen = best_path();
  if (const char* forced = std::getenv("MET_CPU_ISA"); forced != nullptr && *forced != '\0') {
    try {
      chosen = parse_path(forced);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(e.what());
    }
    const std::string why = path_unsupported_reason(chosen);
    if (!why.empty()) {
      throw std::runtime_error(std::string("MET_CPU_ISA=") + forced + ": " + why);
    }
  }
  // Another thread may have chosen meanwhile; the first choice stands.
  g_active.compare_exchange_strong(current, static_cast<int>(chosen), std::memory_order_acq_rel);
  return static_cast<CpuPath>(g_active.load(std::memory_order_acquire));
}

void set_amx_emulation(bool on) { g_amx_emulation.store(on, std::memory_order_release); }

bool amx_emulation() { return g_amx_emulation.load(std::memory_order_acquire); }

void set_active_path(CpuPath path) {
  const std::string why = path_unsupported_reason(path);
  if (!why.empty()) throw std::runtime_error(std::string(path_name(path)) + ": " + why);
  g_active.store(static_cast<int>(path), std::memory_order_release);
}

}  // namespace met::cpu
