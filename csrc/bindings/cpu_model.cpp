// Binds the CPU model as _core.cpu.LlamaForward (built from the typed LlamaDims and LlamaWeights
// of cpu_weights.cpp) plus its elementwise kernels (rms_norm, rope, silu_mul) over raw addresses:
// python/met/model/cpu_llama.py owns the tensors, checks their dtypes and keeps them alive as
// long as the LlamaForward that points into them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/llama_forward.h"
#include "cpu/ops.h"
#include "cpu/sampling.h"
#include "met/direct_forward.h"
#include "met/state_checkpoints.h"

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

// A step's rows packed as the forward reads them: each row's tokens, the position after its last
// (seq_len) and its block table padded to the widest; a row gets a logits row per token when
// `every` (a verify row), else one for its last.
class PackedRows {
 public:
  PackedRows(size_t n_rows, size_t stride) : stride_(stride), flat_(n_rows * stride, 0) {}

  template <typename Token>
  void add(const std::vector<Token>& tokens, int32_t start, const std::vector<int32_t>& table,
           bool every) {
    if (tokens.empty()) throw py::value_error("a row needs at least one token");
    const auto first = static_cast<int64_t>(ids_.size());
    ids_.insert(ids_.end(), tokens.begin(), tokens.end());
    const auto end = static_cast<int64_t>(ids_.size());
    cu_.push_back(static_cast<int32_t>(end));
    lens_.push_back(start + static_cast<int32_t>(tokens.size()));
    for (int64_t t = every ? first : end - 1; t < end; ++t) logits_rows_.push_back(t);
    std::copy(table.begin(), table.end(), flat_.begin() + (lens_.size() - 1) * stride_);
  }

  int64_t n_logits() const { return static_cast<int64_t>(logits_rows_.size()); }

  // Valid while this PackedRows lives.
  cpu::ForwardBatch batch() const {
    cpu::ForwardBatch b;
    b.ids = ids_.data();
    b.rows = cpu::AttnRows{static_cast<int64_t>(lens_.size()), cu_.data(), lens_.data(),
                           flat_.data(), static_cast<int64_t>(stride_)};
    b.logits_rows = logits_rows_.data();
    b.n_logits = n_logits();
    return b;
  }

 private:
  size_t stride_;
  std::vector<int64_t> ids_;
  std::vector<int32_t> cu_{0}, lens_, flat_;
  std::vector<int64_t> logits_rows_;
};

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
  PackedRows packed(n_rows, stride);
  for (size_t b = 0; b < n_rows; ++b) {
    packed.add(tokens[b], starts[b], tables[b], b < static_cast<size_t>(spread));
  }
  cpu::ForwardBatch batch = packed.batch();
  batch.state_slots = state_slots.empty() ? nullptr : state_slots.data();
  batch.verify = verify.empty() ? nullptr : verify.data();
  batch.checkpoints = checkpoints.data();
  batch.n_checkpoints = static_cast<int64_t>(checkpoints.size() / 3);
  forward_without_gil(self, batch, logits);
  return py::cast(self.argmax());
}

// The C++ forward as the core's RowForward: its logits stay in a buffer of its own, which the
// host sampler reads in place when a row is sampled. With recurrent layers each row runs on its
// sequence's state slot, and the state copies the prefix cache's checkpoint index asks for after
// a step (a decode reaching a block boundary) and after a verify's rejected drafts are made here
// as well, so such a step never enters Python either.
class CpuRowForward : public RowForward {
 public:
  CpuRowForward(cpu::LlamaForward& forward, StateCheckpoints* checkpoints)
      : forward_(forward), checkpoints_(checkpoints) {}

  std::vector<int32_t> argmax_rows(const StepPlan& plan) override {
    size_t stride = 1;
    for (const PlanRow& row : plan.rows) stride = std::max(stride, row.seq->block_table.size());
    PackedRows packed(plan.rows.size(), stride);
    for (const PlanRow& row : plan.rows) {
      packed.add(row.tokens, row.start, row.seq->block_table, row.kind == RowKind::Verify);
    }
    cpu::ForwardBatch batch = packed.batch();
    if (forward_.has_recurrent()) {
      slots_.clear();
      verify_.clear();
      for (const PlanRow& row : plan.rows) {
        slots_.push_back(row.seq->state_slot);
        verify_.push_back(row.draft > 0 ? 1 : 0);
      }
      batch.state_slots = slots_.data();
      batch.verify = verify_.data();
    }
    logits_.resize(static_cast<size_t>(packed.n_logits() * forward_.vocab()));
    forward_without_gil(forward_, batch, reinterpret_cast<uintptr_t>(logits_.data()));
    if (checkpoints_ != nullptr) {
      for (const CheckpointCopy& c : checkpoints_->commit(plan)) {
        forward_.keep_checkpoint(c.index, c.slot, c.token);
      }
    }
    const std::vector<int64_t>& argmax = forward_.argmax();
    return {argmax.begin(), argmax.end()};
  }
  // A hybrid's state pools as the Python side last pointed the forward at them: a verify row
  // needs a snapshot for each of its tokens, the checkpoint index its pool (the device backend
  // allocates them as it first runs such a row).
  bool runs(const StepPlan& plan) const override {
    if (!forward_.has_recurrent()) return true;
    const cpu::RecurrentState& state = forward_.recurrent_state();
    if (state.conv == nullptr) return false;
    if (checkpoints_ != nullptr && state.n_checkpoints < checkpoints_->count()) return false;
    for (const PlanRow& row : plan.rows) {
      if (row.draft > 0 && static_cast<int64_t>(row.tokens.size()) > state.snap_depth) {
        return false;
      }
    }
    return true;
  }
  bool put_back(const Sequence& seq, int32_t na) override {
    if (forward_.has_recurrent()) forward_.restore_verified(seq.state_slot, na);
    return true;  // without recurrent layers there is nothing to put back
  }
  const float* logits() const override { return logits_.data(); }
  int64_t vocab() const override { return forward_.vocab(); }
  std::vector<int32_t> draw(const std::vector<SampleRow>& rows) override {
    const int64_t vocab = forward_.vocab();
    std::vector<int64_t> index;
    std::vector<cpu::DrawParams> params;
    for (const SampleRow& row : rows) {
      if (row.row < 0 || static_cast<size_t>(row.row + 1) * vocab > logits_.size()) {
        throw std::out_of_range("CpuRowForward: no logits row " + std::to_string(row.row));
      }
      const SamplingParams& p = row.params;
      index.push_back(row.row);
      params.push_back({p.temperature, p.top_k, p.top_p, p.min_p, p.seed,
                        static_cast<uint64_t>(row.n_generated)});
    }
    std::vector<int32_t> out(rows.size());
    cpu::draw_rows(logits_.data(), static_cast<int32_t>(vocab), index.data(), params.data(),
                   static_cast<int32_t>(rows.size()), out.data());
    return out;
  }

 private:
  cpu::LlamaForward& forward_;
  StateCheckpoints* checkpoints_;  // null: no recurrent layers or no prefix cache
  std::vector<float> logits_;
  std::vector<int32_t> slots_;
  std::vector<uint8_t> verify_;
};

// The DirectForward the engine puts between the scheduler and its Python backend; the
// RowForward is a base so that it is built before the DirectForward that holds it.
struct CpuRows {
  CpuRowForward rows;
};

class CpuDirectForward : private CpuRows, public DirectForward {
 public:
  CpuDirectForward(Backend& device, cpu::LlamaForward& forward, StateCheckpoints* checkpoints)
      : CpuRows{CpuRowForward(forward, checkpoints)}, DirectForward(device, rows) {}
};

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

  // keep_alive: the DirectForward holds both by reference.
  py::class_<CpuDirectForward, Backend>(
      cpu, "DirectForward",
      "the scheduler's backend for a model on this forward: decode and verify steps without a "
      "grammar row run the forward from C++ (their sampling comes back to the wrapped "
      "backend's sample_logits), every other call goes to the wrapped backend; a hybrid's "
      "checkpoint index (its prefix cache) is told of the steps run here")
      .def(py::init<Backend&, cpu::LlamaForward&, StateCheckpoints*>(), py::arg("device"),
           py::arg("forward"), py::arg("checkpoints") = nullptr, py::keep_alive<1, 2>(),
           py::keep_alive<1, 3>(), py::keep_alive<1, 4>())
      .def_property_readonly("direct_steps", &DirectForward::direct_steps)
      .def_property_readonly("device_steps", &DirectForward::device_steps);

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
