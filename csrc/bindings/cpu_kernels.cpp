// Binds the CPU kernels as _core.cpu: functions over raw addresses (tensor.data_ptr()) and
// sizes, so torch never links into the extension; python/met/kernels/cpu_quant.py checks the
// tensors' dtypes, shapes and contiguity before calling in. The GIL is released while the
// kernel runs so that server threads keep going.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "bindings/cpu_common.h"
#include "cpu/attention.h"
#include "cpu/delta_rule.h"
#include "cpu/isa.h"
#include "cpu/quant_matmul.h"

namespace py = pybind11;

namespace met::bindings {

cpu::QType parse_qtype(const std::string& name) {
  if (name == "Q8_0") return cpu::QType::kQ8_0;
  if (name == "Q4_0") return cpu::QType::kQ4_0;
  if (name == "Q4_1") return cpu::QType::kQ4_1;
  if (name == "MXFP4") return cpu::QType::kMxfp4;
  if (name == "Q4_K") return cpu::QType::kQ4_K;
  if (name == "Q5_0") return cpu::QType::kQ5_0;
  if (name == "Q6_K") return cpu::QType::kQ6_K;
  if (name == "Q5_1") return cpu::QType::kQ5_1;
  if (name == "Q5_K") return cpu::QType::kQ5_K;
  if (name == "IQ4_NL") return cpu::QType::kIq4Nl;
  if (name == "IQ4_XS") return cpu::QType::kIq4Xs;
  if (name == "Q3_K") return cpu::QType::kQ3_K;
  if (name == "Q2_K") return cpu::QType::kQ2_K;
  throw py::value_error(
      "qtype must be Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K "
      "or IQ4_XS, not " +
      name);
}

namespace {

cpu::Isa parse_isa(const std::string& name) {
  for (const cpu::Isa isa : {cpu::Isa::kAuto, cpu::Isa::kScalar, cpu::Isa::kAvx2,
                             cpu::Isa::kAvx512Vnni, cpu::Isa::kAmxInt8, cpu::Isa::kAmxEmulated}) {
    if (name == cpu::isa_name(isa)) return isa;
  }
  throw py::value_error(
      "isa must be auto, scalar, avx2, avx512vnni, amx-int8 or amx-emulated, not " + name);
}

}  // namespace

namespace {

void check_delta_shape(int64_t n, int64_t heads, int64_t k_dim, int64_t v_dim) {
  if (n < 0 || heads <= 0 || k_dim <= 0 || v_dim <= 0) {
    throw py::value_error("delta rule: need a count >= 0 and positive heads, k_dim and v_dim");
  }
}

// Gated DeltaNet's delta rule (csrc/cpu/delta_rule.h) over fp32 tensors' addresses.
void bind_delta_rule(py::module_& cpu) {
  cpu.def(
      "delta_rule_step",
      [](uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t g, uintptr_t beta, uintptr_t states,
         uintptr_t slots, uintptr_t out, int64_t rows, int64_t heads, int64_t k_dim,
         int64_t v_dim) {
        check_delta_shape(rows, heads, k_dim, v_dim);
        const cpu::CpuPath path = cpu::active_path();
        py::gil_scoped_release release;
        cpu::delta_rule_step(reinterpret_cast<const float*>(q), reinterpret_cast<const float*>(k),
                             reinterpret_cast<const float*>(v), reinterpret_cast<const float*>(g),
                             reinterpret_cast<const float*>(beta), reinterpret_cast<float*>(states),
                             reinterpret_cast<const int64_t*>(slots), reinterpret_cast<float*>(out),
                             rows, cpu::DeltaShape{heads, k_dim, v_dim}, path);
      },
      py::arg("q_ptr"), py::arg("k_ptr"), py::arg("v_ptr"), py::arg("g_ptr"), py::arg("beta_ptr"),
      py::arg("states_ptr"), py::arg("slots_ptr"), py::arg("out_ptr"), py::arg("rows"),
      py::arg("heads"), py::arg("k_dim"), py::arg("v_dim"),
      "one token of the gated delta rule for `rows` rows on the active path, each row's state "
      "at states[slots[row]] (int64 slots) updated in place");
  cpu.def(
      "delta_rule_chunk",
      [](uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t g, uintptr_t beta, uintptr_t state,
         uintptr_t out, int64_t tokens, int64_t heads, int64_t k_dim, int64_t v_dim,
         int64_t chunk) {
        check_delta_shape(tokens, heads, k_dim, v_dim);
        if (chunk <= 0) throw py::value_error("delta_rule_chunk: chunk must be positive");
        py::gil_scoped_release release;
        cpu::delta_rule_chunk(reinterpret_cast<const float*>(q), reinterpret_cast<const float*>(k),
                              reinterpret_cast<const float*>(v), reinterpret_cast<const float*>(g),
                              reinterpret_cast<const float*>(beta), reinterpret_cast<float*>(state),
                              reinterpret_cast<float*>(out), tokens,
                              cpu::DeltaShape{heads, k_dim, v_dim}, chunk);
      },
      py::arg("q_ptr"), py::arg("k_ptr"), py::arg("v_ptr"), py::arg("g_ptr"), py::arg("beta_ptr"),
      py::arg("state_ptr"), py::arg("out_ptr"), py::arg("tokens"), py::arg("heads"),
      py::arg("k_dim"), py::arg("v_dim"), py::arg("chunk"),
      "the gated delta rule over one row's tokens, chunkwise, its state updated in place");
}

}  // namespace

void bind_cpu_kernels(py::module_& m) {
  auto cpu = m.def_submodule("cpu", "CPU kernels on GGUF-quantized weights (raw pointers)");
  cpu.def(
      "best_isa", [] { return std::string(cpu::isa_name(cpu::best_isa())); },
      "the matmul kernel quant_matmul takes on the active path");
  cpu.def(
      "matmul_kernel", [] { return cpu::isa_description(cpu::best_isa()); },
      "what the active path's matmul runs, e.g. 'avx512vnni' or 'amx-int8 tiles'");
  cpu.def("set_amx_emulation", &cpu::set_amx_emulation, py::arg("on"),
          "testing hook: the amx path's tile kernels on scalar-emulated tiles (a CPU with AVX-512 "
          "VNNI but no AMX then supports the amx path); forwards read it when built");
  cpu.def("amx_min_rows", &cpu::amx_min_rows, "rows from which the amx path takes tiles");
  cpu.def("set_amx_min_rows", &cpu::set_amx_min_rows, py::arg("rows"),
          "testing hook: 1 takes tiles for every matmul, 16 for none below 16 rows");
  cpu.def(
      "cpu_path", [] { return std::string(cpu::path_name(cpu::active_path())); },
      "the kernel path in use: MET_CPU_ISA, else the fastest this CPU runs, unless set_cpu_path "
      "chose another; RuntimeError for a bad MET_CPU_ISA");
  cpu.def(
      "set_cpu_path",
      [](const std::string& name) {
        cpu::CpuPath path;
        try {
          path = cpu::parse_path(name);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
        cpu::set_active_path(path);
      },
      py::arg("path"),
      "forces the kernel path for every later kernel call and CPU forward built after it; "
      "RuntimeError when this CPU cannot run it");
  cpu.def(
      "default_path", [] { return std::string(cpu::path_name(cpu::best_path())); },
      "the path taken when MET_CPU_ISA is unset");
  cpu.def(
      "path_support",
      [] {
        py::dict out;
        for (const cpu::CpuPath path : cpu::kAllPaths) {
          out[cpu::path_name(path)] = cpu::path_unsupported_reason(path);
        }
        return out;
      },
      "{path: '' when this CPU runs it, else why not}, slowest first");
  cpu.def(
      "cpu_features",
      [] {
        const cpu::CpuFeatures& f = cpu::cpu_features();
        py::dict out;
        out["avx2"] = f.avx2 && f.fma && f.f16c;
        out["avx512f"] = f.avx512f;
        out["avx512_vnni"] = f.avx512vnni && f.avx512vl;
        out["avx512_bf16"] = f.avx512bf16;
        out["amx_int8"] = f.amx_tile && f.amx_int8;
        out["amx_bf16"] = f.amx_tile && f.amx_bf16;
        out["amx_permitted"] = f.amx_permitted;
        return out;
      },
      "the CPU features behind the kernel paths");
  cpu.def("isa_supported",
          [](const std::string& isa) { return cpu::isa_supported(parse_isa(isa)); });
  cpu.def(
      "block_elements",
      [](const std::string& qtype) { return cpu::block_elements(parse_qtype(qtype)); },
      "elements per block of the format: K must be a multiple of it (32; 256 for the K-quants and "
      "IQ4_XS)");
  cpu.def("row_bytes", [](const std::string& qtype, int64_t k) {
    const cpu::QType q = parse_qtype(qtype);
    if (k % cpu::block_elements(q) != 0) {
      throw py::value_error(qtype + " needs K a multiple of " +
                            std::to_string(cpu::block_elements(q)));
    }
    return cpu::row_bytes(q, k);
  });
  cpu.def(
      "dequantize_rows",
      [](uintptr_t w, uintptr_t out, int64_t rows, int64_t k, const std::string& qtype) {
        const cpu::QType q = parse_qtype(qtype);
        if (rows < 0 || k <= 0 || k % cpu::block_elements(q) != 0) {
          throw py::value_error("dequantize_rows: need rows >= 0 and K a positive multiple of " +
                                std::to_string(cpu::block_elements(q)));
        }
        const auto* src = reinterpret_cast<const uint8_t*>(w);
        auto* dst = reinterpret_cast<float*>(out);
        py::gil_scoped_release release;
        for (int64_t r = 0; r < rows; ++r) {
          cpu::dequantize_row(q, src + r * cpu::row_bytes(q, k), dst + r * k, k);
        }
      },
      py::arg("w_ptr"), py::arg("out_ptr"), py::arg("rows"), py::arg("K"), py::arg("qtype"),
      "out[rows, K] fp32 = the C++ kernels' reading of rows of GGUF blocks (their reference)");
  cpu.def(
      "quant_matmul",
      [](uintptr_t x, uintptr_t w, uintptr_t y, int64_t rows, int64_t n, int64_t k,
         const std::string& qtype, int n_threads, const std::string& isa) {
        const cpu::QType q = parse_qtype(qtype);
        const cpu::Isa path = parse_isa(isa);
        py::gil_scoped_release release;
        cpu::quant_matmul(reinterpret_cast<const float*>(x), reinterpret_cast<const uint8_t*>(w),
                          reinterpret_cast<float*>(y), rows, n, k, q, n_threads, path);
      },
      py::arg("x_ptr"), py::arg("w_ptr"), py::arg("y_ptr"), py::arg("M"), py::arg("N"),
      py::arg("K"), py::arg("qtype"), py::arg("n_threads") = 0, py::arg("isa") = "auto",
      "y[M, N] = x[M, K] @ W[N, K]^T; W in GGUF blocks, x and y dense fp32");
  cpu.def(
      "paged_attention",
      [](uintptr_t q, uintptr_t k_cache, uintptr_t v_cache, uintptr_t out, int64_t n_rows,
         uintptr_t cu_seqlens, uintptr_t seq_lens, uintptr_t block_tables, int64_t table_stride,
         int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t block_size, float scale,
         int n_threads, bool kv_half, int64_t window, uintptr_t sinks) {
        if (n_rows < 0 || n_kv_heads <= 0 || n_heads <= 0 || n_heads % n_kv_heads != 0 ||
            head_dim <= 0 || block_size <= 0) {
          throw py::value_error(
              "paged_attention: need n_rows >= 0, positive sizes and n_heads a multiple of "
              "n_kv_heads");
        }
        if (window < 0) {
          throw py::value_error("paged_attention: window must be >= 0 (0: the whole context)");
        }
        const cpu::AttnRows rows{n_rows, reinterpret_cast<const int32_t*>(cu_seqlens),
                                 reinterpret_cast<const int32_t*>(seq_lens),
                                 reinterpret_cast<const int32_t*>(block_tables), table_stride};
        cpu::AttnShape shape{n_heads, n_kv_heads, head_dim, block_size, scale, kv_half, window};
        shape.sinks = reinterpret_cast<const float*>(sinks);
        const auto* qp = reinterpret_cast<const float*>(q);
        const auto* kp = reinterpret_cast<const void*>(k_cache);
        const auto* vp = reinterpret_cast<const void*>(v_cache);
        auto* op = reinterpret_cast<float*>(out);
        py::gil_scoped_release release;
        if (n_threads > 0) {
#ifdef _OPENMP
#pragma omp parallel num_threads(n_threads)
#endif
          cpu::paged_attention(qp, kp, vp, op, rows, shape);
        } else {
          cpu::paged_attention(qp, kp, vp, op, rows, shape);
        }
      },
      py::arg("q_ptr"), py::arg("k_ptr"), py::arg("v_ptr"), py::arg("out_ptr"), py::arg("n_rows"),
      py::arg("cu_ptr"), py::arg("seq_lens_ptr"), py::arg("tables_ptr"), py::arg("table_stride"),
      py::arg("n_heads"), py::arg("n_kv_heads"), py::arg("head_dim"), py::arg("block_size"),
      py::arg("scale"), py::arg("n_threads") = 0, py::arg("kv_half") = false, py::arg("window") = 0,
      py::arg("sinks_ptr") = 0,
      "causal paged attention over one layer's KV pool, fp32 or fp16 with kv_half (see "
      "csrc/cpu/attention.h); int32 "
      "cu_seqlens/seq_lens/block_tables; n_threads > 0 runs a team of that many threads, 0 runs "
      "serially; window > 0: a query at position p attends to keys p - window + 1 .. p only; "
      "sinks_ptr: [n_heads] fp32 sink logits in each head's softmax denominator (0: none)");
  bind_delta_rule(cpu);
}

}  // namespace met::bindings
