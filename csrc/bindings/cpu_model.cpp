// Binds the CPU model as _core.cpu.LlamaForward (built from the typed LlamaDims and LlamaWeights
// of cpu_weights.cpp) plus its elementwise kernels (rms_norm, rope, silu_mul) over raw addresses:
// python/met/model/cpu_llama.py owns the tensors, checks their dtypes and keeps them alive as
// long as the LlamaForward that points into them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/llama_forward.h"
#include "cpu/ops.h"

namespace py = pybind11;

namespace met::bindings {

namespace {

template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

std::unique_ptr<cpu::LlamaForward> make_forward(const cpu::LlamaDims& dims,
                                                const cpu::LlamaWeights& weights, uintptr_t k_cache,
                                                uintptr_t v_cache, int n_threads) {
  try {
    return std::make_unique<cpu::LlamaForward>(dims, weights, ptr<void>(k_cache),
                                               ptr<void>(v_cache), n_threads);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
}

// Bad rows surface as ValueError; the GIL is free while the forward runs.
void forward_without_gil(cpu::LlamaForward& self, const cpu::ForwardBatch& batch,
                         uintptr_t logits) {
  try {
    py::gil_scoped_release release;
    self.forward(batch, ptr<float>(logits));
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
}

void run_forward(cpu::LlamaForward& self, uintptr_t ids, int64_t n_rows, uintptr_t cu_seqlens,
                 uintptr_t seq_lens, uintptr_t block_tables, int64_t table_stride,
                 uintptr_t logits_rows, int64_t n_logits, uintptr_t logits, uintptr_t state_slots,
                 uintptr_t verify, uintptr_t checkpoints, int64_t n_checkpoints) {
  cpu::ForwardBatch batch;
  batch.state_slots = ptr<const int32_t>(state_slots);
  batch.verify = ptr<const uint8_t>(verify);
  batch.checkpoints = ptr<const int64_t>(checkpoints);
  batch.n_checkpoints = n_checkpoints;
  batch.ids = ptr<const int64_t>(ids);
  batch.rows = cpu::AttnRows{n_rows, ptr<const int32_t>(cu_seqlens), ptr<const int32_t>(seq_lens),
                             ptr<const int32_t>(block_tables), table_stride};
  batch.logits_rows = ptr<const int64_t>(logits_rows);
  batch.n_logits = n_logits;
  forward_without_gil(self, batch, logits);
}

// The backend's own shape of a step: each row's new tokens, the position of its first one and
// its block table; the first `spread` rows (verify rows) get a logits row per token, the others
// one for their last. Packing here rather than in Python keeps a step's host work small.
py::list run_rows(cpu::LlamaForward& self, const std::vector<std::vector<int64_t>>& tokens,
                  const std::vector<int32_t>& starts,
                  const std::vector<std::vector<int32_t>>& tables, uintptr_t logits, int64_t spread,
                  const std::vector<int32_t>& state_slots, const std::vector<uint8_t>& verify,
                  const std::vector<int64_t>& checkpoints) {
  const size_t n_rows = tokens.size();
  if (starts.size() != n_rows || tables.size() != n_rows) {
    throw py::value_error("tokens, starts and tables need one entry per row");
  }
  if (spread < 0 || static_cast<size_t>(spread) > n_rows) {
    throw py::value_error("spread: between 0 and the number of rows");
  }
  if ((!state_slots.empty() && state_slots.size() != n_rows) ||
      (!verify.empty() && verify.size() != n_rows)) {
    throw py::value_error("state_slots and verify: one per row, or none");
  }
  if (checkpoints.size() % 3 != 0) {
    throw py::value_error("checkpoints: (row, position, index) triples, flat");
  }
  size_t stride = 1;
  for (const auto& t : tables) stride = std::max(stride, t.size());
  std::vector<int64_t> ids;
  std::vector<int32_t> cu{0}, lens, flat(n_rows * stride, 0);
  std::vector<int64_t> logits_rows;
  for (size_t b = 0; b < n_rows; ++b) {
    if (tokens[b].empty()) throw py::value_error("a row needs at least one token");
    const auto first = static_cast<int64_t>(ids.size());
    ids.insert(ids.end(), tokens[b].begin(), tokens[b].end());
    cu.push_back(static_cast<int32_t>(ids.size()));
    lens.push_back(starts[b] + static_cast<int32_t>(tokens[b].size()));
    const auto end = static_cast<int64_t>(ids.size());
    for (int64_t t = b < static_cast<size_t>(spread) ? first : end - 1; t < end; ++t) {
      logits_rows.push_back(t);
    }
    std::copy(tables[b].begin(), tables[b].end(), flat.begin() + b * stride);
  }
  cpu::ForwardBatch batch;
  batch.ids = ids.data();
  batch.rows = cpu::AttnRows{static_cast<int64_t>(n_rows), cu.data(), lens.data(), flat.data(),
                             static_cast<int64_t>(stride)};
  batch.logits_rows = logits_rows.data();
  batch.n_logits = static_cast<int64_t>(logits_rows.size());
  batch.state_slots = state_slots.empty() ? nullptr : state_slots.data();
  batch.verify = verify.empty() ? nullptr : verify.data();
  batch.checkpoints = checkpoints.data();
  batch.n_checkpoints = static_cast<int64_t>(checkpoints.size() / 3);
  forward_without_gil(self, batch, logits);
  return py::cast(self.argmax());
}

}  // namespace

void bind_cpu_model(py::module_& m) {
  auto cpu = m.attr("cpu").cast<py::module_>();
  py::class_<cpu::LlamaForward>(cpu, "LlamaForward",
                                "a whole packed forward of a Llama-style model on GGUF blocks")
      .def(py::init(&make_forward), py::arg("dims"), py::arg("weights"), py::arg("k_cache"),
           py::arg("v_cache"), py::arg("n_threads") = 0)
      .def("forward", &run_forward, py::arg("ids"), py::arg("n_rows"), py::arg("cu_seqlens"),
           py::arg("seq_lens"), py::arg("block_tables"), py::arg("table_stride"),
           py::arg("logits_rows"), py::arg("n_logits"), py::arg("logits"),
           py::arg("state_slots") = 0, py::arg("verify") = 0, py::arg("checkpoints") = 0,
           py::arg("n_checkpoints") = 0,
           "int64 ids, int32 cu_seqlens / seq_lens / block tables, int64 logits rows, fp32 "
           "logits [n_logits, vocab]; with recurrent layers int32 state slots and uint8 verify "
           "flags per row (0: none verify) and int64 (row, position, index) checkpoint triples")
      .def("forward_rows", &run_rows, py::arg("tokens"), py::arg("starts"), py::arg("tables"),
           py::arg("logits"), py::arg("spread") = 0,
           py::arg("state_slots") = std::vector<int32_t>{},
           py::arg("verify") = std::vector<uint8_t>{},
           py::arg("checkpoints") = std::vector<int64_t>{},
           "rows given as their new tokens, first positions and block tables (and state slots "
           "and verify flags, with recurrent layers); fills fp32 logits of each token of the "
           "first `spread` rows and of every other row's last token, and returns each logits "
           "row's argmax")
      .def(
          "set_recurrent_state",
          [](cpu::LlamaForward& self, const cpu::RecurrentState& state) {
            try {
              self.set_recurrent_state(state);
            } catch (const std::invalid_argument& e) {
              throw py::value_error(e.what());
            }
          },
          py::arg("state"), "where the recurrent layers' state and snapshots live")
      .def_property_readonly("n_threads", &cpu::LlamaForward::n_threads)
      .def_property_readonly("kernel_seconds", &cpu::LlamaForward::kernel_seconds,
                             "wall time spent inside forward() so far")
      .def_property_readonly("calls", &cpu::LlamaForward::calls)
      .def_property_readonly("isa", [](const cpu::LlamaForward& f) { return f.isa(); })
      .def_property_readonly(
          "path", [](const cpu::LlamaForward& f) { return f.path(); },
          "the kernel path (scalar, avx2, avx512, amx) fixed when this forward was built");

  cpu.def(
      "rms_norm",
      [](uintptr_t x, uintptr_t weight, uintptr_t out, int64_t rows, int64_t dim, float eps) {
        for (int64_t r = 0; r < rows; ++r) {
          cpu::rms_norm_row(ptr<const float>(x) + r * dim, ptr<const float>(weight),
                            ptr<float>(out) + r * dim, dim, eps);
        }
      },
      "rows of x [rows, dim] RMS-normalized and scaled by weight into out");
  cpu.def(
      "rope",
      [](uintptr_t x, uintptr_t cos, uintptr_t sin, int64_t vectors, int64_t head_dim) {
        for (int64_t v = 0; v < vectors; ++v) {
          cpu::rope_rotate_half(ptr<float>(x) + v * head_dim,
                                ptr<const float>(cos) + v * head_dim / 2,
                                ptr<const float>(sin) + v * head_dim / 2, head_dim);
        }
      },
      "rotate-half RoPE in place on [vectors, head_dim] with per-vector cos/sin rows");
  cpu.def(
      "silu_mul",
      [](uintptr_t gate, uintptr_t up, uintptr_t out, int64_t n) {
        cpu::silu_mul_row(ptr<const float>(gate), ptr<const float>(up), ptr<float>(out), n);
      },
      "out = silu(gate) * up over n floats");
}

}  // namespace met::bindings
