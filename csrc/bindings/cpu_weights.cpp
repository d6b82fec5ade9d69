// Binds the C++ CPU forward's typed inputs into the cpu submodule: Mixer and Mlp (what a layer
// is), QuantWeight, LayerWeights, LlamaDims and LlamaWeights. python/met/model/cpu_llama.py fills
// them from the model's per-layer plan; tensors cross as addresses (the caller owns them and keeps
// them alive as long as the forward that points into them), everything else as typed fields.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bindings/cpu_common.h"
#include "cpu/llama_forward.h"

namespace py = pybind11;

namespace met::bindings {

namespace {

// A `const float*` member read and written as an integer address (0: none), and a list of them.
template <typename C>
void addresses(py::class_<C>& c, const char* name, std::vector<const float*> C::*member,
               const char* doc) {
  c.def_property(
      name,
      [member](const C& self) {
        std::vector<uintptr_t> out;
        for (const float* p : self.*member) out.push_back(reinterpret_cast<uintptr_t>(p));
        return out;
      },
      [member](C& self, const std::vector<uintptr_t>& in) {
        (self.*member).clear();
        for (uintptr_t a : in) (self.*member).push_back(reinterpret_cast<const float*>(a));
      },
      doc);
}

template <typename C>
void address(py::class_<C>& c, const char* name, const float* C::*member, const char* doc) {
  c.def_property(
      name, [member](const C& self) { return reinterpret_cast<uintptr_t>(self.*member); },
      [member](C& self, uintptr_t a) { self.*member = reinterpret_cast<const float*>(a); }, doc);
}

void bind_quant_weight(py::module_& cpu) {
  py::class_<cpu::QuantWeight>(cpu, "QuantWeight", "a linear weight [n, k] held as GGUF blocks")
      .def(py::init([](uintptr_t data, const std::string& qtype, int64_t n, int64_t k) {
             return cpu::QuantWeight{reinterpret_cast<const uint8_t*>(data), parse_qtype(qtype), n,
                                     k};
           }),
           py::arg("data"), py::arg("qtype"), py::arg("n"), py::arg("k"))
      .def_readonly("n", &cpu::QuantWeight::n)
      .def_readonly("k", &cpu::QuantWeight::k);
}

void bind_layer(py::module_& cpu) {
  py::enum_<cpu::Mixer>(cpu, "Mixer", "a layer's token mixer")
      .value("attention", cpu::Mixer::kAttention)
      .value("recurrent", cpu::Mixer::kRecurrent);
  py::enum_<cpu::Mlp>(cpu, "Mlp", "a layer's MLP")
      .value("dense", cpu::Mlp::kDense)
      .value("moe", cpu::Mlp::kMoe)
      .value("dense_and_moe", cpu::Mlp::kDenseAndMoe);
  py::class_<cpu::LayerWeights> l(cpu, "LayerWeights", "one decoder layer: its kind and weights");
  l.def(py::init<>())
      .def_readwrite("mixer", &cpu::LayerWeights::mixer)
      .def_readwrite("mlp", &cpu::LayerWeights::mlp)
      .def_readwrite("wqkv", &cpu::LayerWeights::wqkv)
      .def_readwrite("wo", &cpu::LayerWeights::wo)
      .def_readwrite("wqkv_parts", &cpu::LayerWeights::wqkv_parts)
      .def_readwrite("w_gate_up_parts", &cpu::LayerWeights::w_gate_up_parts)
      .def_readwrite("w_gate_up", &cpu::LayerWeights::w_gate_up)
      .def_readwrite("w_down", &cpu::LayerWeights::w_down)
      .def_readwrite("expert_gate_up", &cpu::LayerWeights::expert_gate_up)
      .def_readwrite("expert_down", &cpu::LayerWeights::expert_down)
      .def_readwrite("qk_norm_full", &cpu::LayerWeights::qk_norm_full)
      .def_readwrite("no_rope", &cpu::LayerWeights::no_rope)
      .def_readwrite("window", &cpu::LayerWeights::window)
      .def_readwrite("head_dim", &cpu::LayerWeights::head_dim)
      .def_readwrite("n_kv_heads", &cpu::LayerWeights::n_kv_heads)
      .def_readwrite("shared_kv", &cpu::LayerWeights::shared_kv)
      .def_readwrite("k_as_v", &cpu::LayerWeights::k_as_v)
      .def_readwrite("attn_gate", &cpu::LayerWeights::attn_gate)
      .def_readwrite("shexp_gate_up", &cpu::LayerWeights::shexp_gate_up)
      .def_readwrite("shexp_down", &cpu::LayerWeights::shexp_down)
      .def_readwrite("ssm_qkv", &cpu::LayerWeights::ssm_qkv)
      .def_readwrite("ssm_z", &cpu::LayerWeights::ssm_z)
      .def_readwrite("ssm_beta", &cpu::LayerWeights::ssm_beta)
      .def_readwrite("ssm_alpha", &cpu::LayerWeights::ssm_alpha)
      .def_readwrite("ssm_out", &cpu::LayerWeights::ssm_out)
      .def_readwrite("state_index", &cpu::LayerWeights::state_index)
      .def_readwrite("per_layer_input", &cpu::LayerWeights::per_layer_input)
      .def_readwrite("ple_gate", &cpu::LayerWeights::ple_gate)
      .def_readwrite("ple_proj", &cpu::LayerWeights::ple_proj);
  l.def_property(
      "k_pages", [](const cpu::LayerWeights& w) { return reinterpret_cast<uintptr_t>(w.k_pages); },
      [](cpu::LayerWeights& w, uintptr_t a) { w.k_pages = reinterpret_cast<void*>(a); },
      "this layer's K pages (a pool of several widths); 0: the model's pool");
  l.def_property(
      "v_pages", [](const cpu::LayerWeights& w) { return reinterpret_cast<uintptr_t>(w.v_pages); },
      [](cpu::LayerWeights& w, uintptr_t a) { w.v_pages = reinterpret_cast<void*>(a); },
      "this layer's V pages; 0: the model's pool");
  address(l, "v_norm", &cpu::LayerWeights::v_norm, "float32 [head_dim] V norm; 0: none");
  address(l, "out_scale", &cpu::LayerWeights::out_scale, "float32 [1] output scale; 0: none");
  address(l, "attn_norm", &cpu::LayerWeights::attn_norm, "float32 [dim]; 0: no pre-norms");
  address(l, "bqkv", &cpu::LayerWeights::bqkv, "float32 q/k/v biases; 0: none");
  address(l, "q_norm", &cpu::LayerWeights::q_norm, "float32 [head_dim] or [q width]; 0: none");
  address(l, "k_norm", &cpu::LayerWeights::k_norm, "float32 [head_dim] or [kv width]; 0: none");
  address(l, "mlp_norm", &cpu::LayerWeights::mlp_norm, "float32 [dim]; 0: no pre-norms");
  address(l, "router", &cpu::LayerWeights::router, "float32 [n_experts, dim] (a MoE layer)");
  address(l, "post_attn_norm", &cpu::LayerWeights::post_attn_norm, "float32 [dim]; 0: none");
  address(l, "post_mlp_norm", &cpu::LayerWeights::post_mlp_norm, "float32 [dim]; 0: none");
  address(l, "rope_cos", &cpu::LayerWeights::rope_cos, "this layer's own table; 0: the model's");
  address(l, "rope_sin", &cpu::LayerWeights::rope_sin, "this layer's own table; 0: the model's");
  address(l, "sinks", &cpu::LayerWeights::sinks, "float32 [n_heads] sink logits; 0: none");
  address(l, "bo", &cpu::LayerWeights::bo, "float32 [dim] output projection bias; 0: none");
  address(l, "router_bias", &cpu::LayerWeights::router_bias, "float32 [n_experts]; 0: none");
  address(l, "moe_norm", &cpu::LayerWeights::moe_norm, "float32 [dim] experts' input norm");
  address(l, "post_mlp_norm_1", &cpu::LayerWeights::post_mlp_norm_1, "float32 [dim] dense out");
  address(l, "post_moe_norm", &cpu::LayerWeights::post_moe_norm, "float32 [dim] experts' out");
  address(l, "router_scale", &cpu::LayerWeights::router_scale, "float32 [dim] (dense+moe router)");
  address(l, "expert_scale", &cpu::LayerWeights::expert_scale, "float32 [n_experts]; 0: none");
  address(l, "shexp_gate", &cpu::LayerWeights::shexp_gate, "float32 [dim]; 0: no shared expert");
  address(l, "ple_norm", &cpu::LayerWeights::ple_norm, "float32 [dim] per-layer output norm");
  address(l, "ssm_conv", &cpu::LayerWeights::ssm_conv, "float32 [conv_dim, kernel]");
  address(l, "ssm_dt", &cpu::LayerWeights::ssm_dt, "float32 [v_heads] dt bias");
  address(l, "ssm_a", &cpu::LayerWeights::ssm_a, "float32 [v_heads] -exp(A_log)");
  address(l, "ssm_norm", &cpu::LayerWeights::ssm_norm, "float32 [v_dim] gated norm");
  addresses(l, "expert_b_gate_up", &cpu::LayerWeights::expert_b_gate_up,
            "float32 [2 * the experts' width] per expert; empty: none");
  addresses(l, "expert_b_down", &cpu::LayerWeights::expert_b_down,
            "float32 [dim] per expert; empty: none");
}

void bind_recurrent(py::module_& cpu) {
  using R = cpu::RecurrentDims;
  py::class_<R>(cpu, "RecurrentDims", "a Gated DeltaNet layer's shape")
      .def(py::init<>())
      .def_readwrite("k_heads", &R::k_heads)
      .def_readwrite("v_heads", &R::v_heads)
      .def_readwrite("k_dim", &R::k_dim)
      .def_readwrite("v_dim", &R::v_dim)
      .def_readwrite("kernel", &R::kernel)
      .def_readwrite("tiled", &R::tiled);
  using S = cpu::RecurrentState;
  py::class_<S> s(cpu, "RecurrentState", "where the recurrent layers' float32 state lives");
  s.def(py::init<>())
      .def_readwrite("n_slots", &S::n_slots)
      .def_readwrite("snap_depth", &S::snap_depth)
      .def_readwrite("n_checkpoints", &S::n_checkpoints);
  for (auto [name, member] :
       {std::pair{"conv", &S::conv}, std::pair{"delta", &S::delta},
        std::pair{"snap_conv", &S::snap_conv}, std::pair{"snap_delta", &S::snap_delta},
        std::pair{"ckpt_conv", &S::ckpt_conv}, std::pair{"ckpt_delta", &S::ckpt_delta}}) {
    s.def_property(
        name, [member](const S& self) { return reinterpret_cast<uintptr_t>(self.*member); },
        [member](S& self, uintptr_t a) { self.*member = reinterpret_cast<float*>(a); });
  }
}

void bind_dims(py::module_& cpu) {
  using D = cpu::LlamaDims;
  py::class_<D>(cpu, "LlamaDims", "the model's shape, its KV pool's and its model-wide settings")
      .def(py::init<>())
      .def_readwrite("dim", &D::dim)
      .def_readwrite("n_layers", &D::n_layers)
      .def_readwrite("n_heads", &D::n_heads)
      .def_readwrite("n_kv_heads", &D::n_kv_heads)
      .def_readwrite("head_dim", &D::head_dim)
      .def_readwrite("ffn", &D::ffn)
      .def_readwrite("vocab", &D::vocab)
      .def_readwrite("norm_eps", &D::norm_eps)
      .def_readwrite("max_positions", &D::max_positions)
      .def_readwrite("num_blocks", &D::num_blocks)
      .def_readwrite("block_size", &D::block_size)
      .def_readwrite("kv_half", &D::kv_half)
      .def_readwrite("n_experts", &D::n_experts)
      .def_readwrite("n_experts_used", &D::n_experts_used)
      .def_readwrite("moe_norm_topk", &D::moe_norm_topk)
      .def_readwrite("moe_topk_softmax", &D::moe_topk_softmax)
      .def_readwrite("swiglu_limit", &D::swiglu_limit)
      .def_readwrite("swiglu_alpha", &D::swiglu_alpha)
      .def_readwrite("attn_scale", &D::attn_scale)
      .def_readwrite("attn_softcap", &D::attn_softcap)
      .def_readwrite("final_softcap", &D::final_softcap)
      .def_readwrite("embed_scale", &D::embed_scale)
      .def_readwrite("gelu", &D::gelu)
      .def_readwrite("attn_temp_scale", &D::attn_temp_scale)
      .def_readwrite("attn_temp_length", &D::attn_temp_length)
      .def_readwrite("rope_dims", &D::rope_dims)
      .def_readwrite("shared_ffn", &D::shared_ffn)
      .def_readwrite("expert_ffn", &D::expert_ffn)
      .def_readwrite("recurrent", &D::recurrent)
      .def_readwrite("per_layer_dim", &D::per_layer_dim);
}

void bind_weights(py::module_& cpu) {
  using W = cpu::LlamaWeights;
  py::class_<W> w(cpu, "LlamaWeights", "the embedding, head, final norm, layers and RoPE tables");
  w.def(py::init<>())
      .def_readwrite("embed", &W::embed)
      .def_readwrite("lm_head", &W::lm_head)
      .def_readwrite("layers", &W::layers)
      .def_readwrite("ple_embed", &W::ple_embed)
      .def_readwrite("ple_model_proj", &W::ple_model_proj);
  address(w, "ple_embed_dense", &W::ple_embed_dense, "float32 [vocab, n_layers * D]");
  address(w, "ple_proj_norm", &W::ple_proj_norm, "float32 [D]");
  address(w, "embed_dense", &W::embed_dense, "float32 [vocab, dim] when embed is not blocks");
  address(w, "norm", &W::norm, "float32 [dim]");
  address(w, "rope_cos", &W::rope_cos, "float32 [max_positions, head_dim / 2]");
  address(w, "rope_sin", &W::rope_sin, "float32 [max_positions, head_dim / 2]");
}

}  // namespace

void bind_cpu_weights(py::module_& m) {
  auto cpu = m.attr("cpu").cast<py::module_>();
  bind_quant_weight(cpu);
  bind_layer(cpu);
  bind_recurrent(cpu);
  bind_dims(cpu);
  bind_weights(cpu);
}

}  // namespace met::bindings
