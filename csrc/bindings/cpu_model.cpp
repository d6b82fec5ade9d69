// Binds the CPU model as _core.cpu.LlamaForward plus its elementwise kernels (rms_norm, rope,
// silu_mul), all over raw addresses: python/met/model/cpu_llama.py owns the tensors, checks
// their dtypes and keeps them alive as long as the LlamaForward that points into them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bindings/cpu_common.h"
#include "cpu/llama_forward.h"
#include "cpu/ops.h"

namespace py = pybind11;

namespace met::bindings {

namespace {

template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// (address, qtype, n, k); qtype "F32" marks a dense embedding (only the embedding may be one).
cpu::QuantWeight parse_weight(const py::tuple& spec) {
  if (spec.size() != 4) throw py::value_error("a weight is (address, qtype, n, k)");
  cpu::QuantWeight w;
  w.data = ptr<const uint8_t>(spec[0].cast<uintptr_t>());
  w.q = parse_qtype(spec[1].cast<std::string>());
  w.n = spec[2].cast<int64_t>();
  w.k = spec[3].cast<int64_t>();
  return w;
}

cpu::LayerWeights parse_layer(const py::dict& d) {
  cpu::LayerWeights l;
  l.attn_norm = ptr<const float>(d["attn_norm"].cast<uintptr_t>());
  l.wqkv = parse_weight(d["wqkv"]);
  l.bqkv = ptr<const float>(d["bqkv"].cast<uintptr_t>());
  if (d.contains("q_norm")) l.q_norm = ptr<const float>(d["q_norm"].cast<uintptr_t>());
  if (d.contains("k_norm")) l.k_norm = ptr<const float>(d["k_norm"].cast<uintptr_t>());
  l.wo = parse_weight(d["wo"]);
  l.mlp_norm = ptr<const float>(d["mlp_norm"].cast<uintptr_t>());
  auto optional = [&d](const char* key) {
    return d.contains(key) ? ptr<const float>(d[key].cast<uintptr_t>()) : nullptr;
  };
  l.post_attn_norm = optional("post_attn_norm");
  l.post_mlp_norm = optional("post_mlp_norm");
  l.rope_cos = optional("rope_cos");
  l.rope_sin = optional("rope_sin");
  if (d.contains("window")) l.window = d["window"].cast<int64_t>();
  l.qk_norm_full = d.contains("qk_norm_full") && d["qk_norm_full"].cast<bool>();
  l.no_rope = d.contains("no_rope") && d["no_rope"].cast<bool>();
  // Gemma 4: the layer's own widths, pages (a shared-KV layer's are its source's) and V.
  if (d.contains("head_dim")) l.head_dim = d["head_dim"].cast<int64_t>();
  if (d.contains("n_kv_heads")) l.n_kv_heads = d["n_kv_heads"].cast<int64_t>();
  if (d.contains("k_pages")) {
    l.k_pages = ptr<void>(d["k_pages"].cast<uintptr_t>());
    l.v_pages = ptr<void>(d["v_pages"].cast<uintptr_t>());
  }
  l.shared_kv = d.contains("shared_kv") && d["shared_kv"].cast<bool>();
  l.k_as_v = d.contains("k_as_v") && d["k_as_v"].cast<bool>();
  l.v_norm = optional("v_norm");
  l.out_scale = optional("out_scale");
  if (d.contains("router")) {  // a MoE layer: [(gate_up, down)] per expert
    l.router = ptr<const float>(d["router"].cast<uintptr_t>());
    for (const py::handle expert : d["experts"].cast<py::list>()) {
      const auto pair = expert.cast<py::tuple>();
      l.expert_gate_up.push_back(parse_weight(pair[0]));
      l.expert_down.push_back(parse_weight(pair[1]));
    }
    return l;
  }
  l.w_gate_up = parse_weight(d["w_gate_up"]);
  l.w_down = parse_weight(d["w_down"]);
  return l;
}

cpu::LlamaDims parse_dims(const py::dict& d) {
  cpu::LlamaDims dims;
  dims.dim = d["dim"].cast<int64_t>();
  dims.n_layers = d["n_layers"].cast<int64_t>();
  dims.n_heads = d["n_heads"].cast<int64_t>();
  dims.n_kv_heads = d["n_kv_heads"].cast<int64_t>();
  dims.head_dim = d["head_dim"].cast<int64_t>();
  dims.ffn = d["ffn"].cast<int64_t>();
  dims.vocab = d["vocab"].cast<int64_t>();
  dims.norm_eps = d["norm_eps"].cast<float>();
  dims.max_positions = d["max_positions"].cast<int64_t>();
  dims.num_blocks = d["num_blocks"].cast<int64_t>();
  dims.block_size = d["block_size"].cast<int64_t>();
  dims.kv_half = d.contains("kv_half") && d["kv_half"].cast<bool>();
  if (d.contains("n_experts")) {
    dims.n_experts = d["n_experts"].cast<int64_t>();
    dims.n_experts_used = d["n_experts_used"].cast<int64_t>();
    dims.moe_norm_topk = d["moe_norm_topk"].cast<bool>();
  }
  if (d.contains("attn_scale")) dims.attn_scale = d["attn_scale"].cast<float>();
  if (d.contains("attn_softcap")) dims.attn_softcap = d["attn_softcap"].cast<float>();
  if (d.contains("final_softcap")) dims.final_softcap = d["final_softcap"].cast<float>();
  if (d.contains("embed_scale")) dims.embed_scale = d["embed_scale"].cast<float>();
  dims.gelu = d.contains("gelu") && d["gelu"].cast<bool>();
  if (d.contains("attn_temp_scale")) {
    dims.attn_temp_scale = d["attn_temp_scale"].cast<double>();
    dims.attn_temp_length = d["attn_temp_length"].cast<int64_t>();
  }
  return dims;
}

std::unique_ptr<cpu::LlamaForward> make_forward(const py::dict& dims, const py::tuple& embed,
                                                const py::tuple& lm_head, uintptr_t norm,
                                                const py::list& layers, uintptr_t rope_cos,
                                                uintptr_t rope_sin, uintptr_t k_cache,
                                                uintptr_t v_cache, int n_threads) {
  cpu::LlamaWeights w;
  if (embed[1].cast<std::string>() == "F32") {
    w.embed_dense = ptr<const float>(embed[0].cast<uintptr_t>());
  } else {
    w.embed = parse_weight(embed);
  }
  w.lm_head = parse_weight(lm_head);
  w.norm = ptr<const float>(norm);
  for (const py::handle layer : layers) w.layers.push_back(parse_layer(layer.cast<py::dict>()));
  w.rope_cos = ptr<const float>(rope_cos);
  w.rope_sin = ptr<const float>(rope_sin);
  try {
    return std::make_unique<cpu::LlamaForward>(parse_dims(dims), std::move(w), ptr<void>(k_cache),
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
                 uintptr_t logits_rows, int64_t n_logits, uintptr_t logits) {
  cpu::ForwardBatch batch;
  batch.ids = ptr<const int64_t>(ids);
  batch.rows = cpu::AttnRows{n_rows, ptr<const int32_t>(cu_seqlens), ptr<const int32_t>(seq_lens),
                             ptr<const int32_t>(block_tables), table_stride};
  batch.logits_rows = ptr<const int64_t>(logits_rows);
  batch.n_logits = n_logits;
  forward_without_gil(self, batch, logits);
}

// The backend's own shape of a step: each row's new tokens, the position of its first one and
// its block table. Packing here rather than in Python keeps a decode step's host work small.
py::list run_rows(cpu::LlamaForward& self, const std::vector<std::vector<int64_t>>& tokens,
                  const std::vector<int32_t>& starts,
                  const std::vector<std::vector<int32_t>>& tables, uintptr_t logits) {
  const size_t n_rows = tokens.size();
  if (starts.size() != n_rows || tables.size() != n_rows) {
    throw py::value_error("tokens, starts and tables need one entry per row");
  }
  size_t stride = 1;
  for (const auto& t : tables) stride = std::max(stride, t.size());
  std::vector<int64_t> ids;
  std::vector<int32_t> cu{0}, lens, flat(n_rows * stride, 0);
  std::vector<int64_t> logits_rows;
  for (size_t b = 0; b < n_rows; ++b) {
    if (tokens[b].empty()) throw py::value_error("a row needs at least one token");
    ids.insert(ids.end(), tokens[b].begin(), tokens[b].end());
    cu.push_back(static_cast<int32_t>(ids.size()));
    lens.push_back(starts[b] + static_cast<int32_t>(tokens[b].size()));
    logits_rows.push_back(static_cast<int64_t>(ids.size()) - 1);
    std::copy(tables[b].begin(), tables[b].end(), flat.begin() + b * stride);
  }
  cpu::ForwardBatch batch;
  batch.ids = ids.data();
  batch.rows = cpu::AttnRows{static_cast<int64_t>(n_rows), cu.data(), lens.data(), flat.data(),
                             static_cast<int64_t>(stride)};
  batch.logits_rows = logits_rows.data();
  batch.n_logits = static_cast<int64_t>(n_rows);
  forward_without_gil(self, batch, logits);
  return py::cast(self.argmax());
}

}  // namespace

void bind_cpu_model(py::module_& m) {
  auto cpu = m.attr("cpu").cast<py::module_>();
  py::class_<cpu::LlamaForward>(cpu, "LlamaForward",
                                "a whole packed forward of a Llama-style model on GGUF blocks")
      .def(py::init(&make_forward), py::arg("dims"), py::arg("embed"), py::arg("lm_head"),
           py::arg("norm"), py::arg("layers"), py::arg("rope_cos"), py::arg("rope_sin"),
           py::arg("k_cache"), py::arg("v_cache"), py::arg("n_threads") = 0)
      .def("forward", &run_forward, py::arg("ids"), py::arg("n_rows"), py::arg("cu_seqlens"),
           py::arg("seq_lens"), py::arg("block_tables"), py::arg("table_stride"),
           py::arg("logits_rows"), py::arg("n_logits"), py::arg("logits"),
           "int64 ids, int32 cu_seqlens / seq_lens / block tables, int64 logits rows, fp32 "
           "logits [n_logits, vocab]")
      .def("forward_rows", &run_rows, py::arg("tokens"), py::arg("starts"), py::arg("tables"),
           py::arg("logits"),
           "rows given as their new tokens, first positions and block tables; fills fp32 logits "
           "[rows, vocab] of each row's last token and returns each row's argmax")
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
