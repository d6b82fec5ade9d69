// Binds the GPU pieces: _core.has_cuda() and _core.cuda_device_count() always; the _core.cuda
// submodule (kernels and StreamSet) only in a build with CUDA.
// Kernel functions take device pointers as integers (tensor.data_ptr()) and a stream handle
// as an integer (torch.cuda.current_stream().cuda_stream); python/met/kernels/cuda_ops.py is
// the tensor-checking layer over them. Bad sizes raise ValueError before any launch.
#include <pybind11/pybind11.h>

#include <cstdint>

#ifdef MET_HAS_CUDA
#include <cuda_runtime_api.h>

#include "cuda/stream_set.h"
#include "kernels/kernels.h"
#endif

namespace py = pybind11;

namespace met::bindings {

namespace {

#ifdef MET_HAS_CUDA
template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

cudaStream_t as_stream(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

kernels::DType as_dtype(int32_t code) {
  if (code < 0 || code > 2) throw py::value_error("dtype code must be 0 (f32), 1 (f16), 2 (bf16)");
  return static_cast<kernels::DType>(code);
}

kernels::AttentionArgs attention_args(py::kwargs kw) {
  kernels::AttentionArgs a;
  a.out = ptr<void>(kw["out"].cast<uintptr_t>());
  a.q = ptr<const void>(kw["q"].cast<uintptr_t>());
  a.k_cache = ptr<const void>(kw["k_cache"].cast<uintptr_t>());
  a.v_cache = ptr<const void>(kw["v_cache"].cast<uintptr_t>());
  a.block_tables = ptr<const int32_t>(kw["block_tables"].cast<uintptr_t>());
  a.seq_lens = ptr<const int32_t>(kw["seq_lens"].cast<uintptr_t>());
  a.cu_seqlens = ptr<const int32_t>(kw["cu_seqlens"].cast<uintptr_t>());
  a.workspace = kw.contains("workspace") ? ptr<float>(kw["workspace"].cast<uintptr_t>()) : nullptr;
  a.batch = kw["batch"].cast<int32_t>();
  a.max_blocks = kw["max_blocks"].cast<int32_t>();
  a.n_heads = kw["n_heads"].cast<int32_t>();
  a.max_query_len = kw["max_query_len"].cast<int32_t>();
  a.max_seq_len = kw["max_seq_len"].cast<int32_t>();
  a.q_row_stride = kw.contains("q_row_stride") ? kw["q_row_stride"].cast<int64_t>() : 0;
  a.scale = kw["scale"].cast<float>();
  a.kv = {kw["block_size"].cast<int32_t>(), kw["n_kv_heads"].cast<int32_t>(),
          kw["head_dim"].cast<int32_t>()};
  a.dtype = as_dtype(kw["dtype"].cast<int32_t>());
  return a;
}

void bind_kernels(py::module_& cu) {
  cu.def(
      "attention_workspace_floats",
      [](py::kwargs kw) { return kernels::attention_workspace_floats(attention_args(kw)); },
      "Floats of scratch paged_attention needs (keyword arguments as paged_attention).");
  cu.def(
      "paged_attention",
      [](uintptr_t stream, py::kwargs kw) {
        kernels::paged_attention(attention_args(kw), as_stream(stream));
      },
      py::arg("stream"),
      "Paged attention over packed rows; keyword arguments are kernels::AttentionArgs.");
  cu.def(
      "kv_append",
      [](uintptr_t k_cache, uintptr_t v_cache, uintptr_t k, uintptr_t v, uintptr_t slots,
         int32_t n_tokens, int64_t src_row_stride, int32_t block_size, int32_t n_kv_heads,
         int32_t head_dim, int32_t dtype, uintptr_t stream) {
        kernels::kv_append(ptr<void>(k_cache), ptr<void>(v_cache), ptr<const void>(k),
                           ptr<const void>(v), ptr<const int64_t>(slots), n_tokens, src_row_stride,
                           {block_size, n_kv_heads, head_dim}, as_dtype(dtype), as_stream(stream));
      },
      py::arg("k_cache"), py::arg("v_cache"), py::arg("k"), py::arg("v"), py::arg("slot_mapping"),
      py::arg("n_tokens"), py::arg("src_row_stride"), py::arg("block_size"), py::arg("n_kv_heads"),
      py::arg("head_dim"), py::arg("dtype"), py::arg("stream"));
  cu.def(
      "rms_norm",
      [](uintptr_t out, uintptr_t x, uintptr_t weight, int32_t n_tokens, int32_t hidden, float eps,
         int32_t dtype, uintptr_t stream) {
        kernels::rms_norm(ptr<void>(out), ptr<const void>(x), ptr<const void>(weight), n_tokens,
                          hidden, eps, as_dtype(dtype), as_stream(stream));
      },
      py::arg("out"), py::arg("x"), py::arg("weight"), py::arg("n_tokens"), py::arg("hidden"),
      py::arg("eps"), py::arg("dtype"), py::arg("stream"));
  cu.def(
      "rope",
      [](uintptr_t x, uintptr_t positions, uintptr_t cos, uintptr_t sin, int32_t n_tokens,
         int32_t n_heads, int32_t head_dim, int64_t row_stride, int32_t dtype, uintptr_t stream) {
        kernels::rope(ptr<void>(x), ptr<const int64_t>(positions), ptr<const float>(cos),
                      ptr<const float>(sin), n_tokens, n_heads, head_dim, row_stride,
                      as_dtype(dtype), as_stream(stream));
      },
      py::arg("x"), py::arg("positions"), py::arg("cos"), py::arg("sin"), py::arg("n_tokens"),
      py::arg("n_heads"), py::arg("head_dim"), py::arg("row_stride"), py::arg("dtype"),
      py::arg("stream"));
  cu.def(
      "silu_mul",
      [](uintptr_t out, uintptr_t x, int32_t n_tokens, int32_t ffn, int32_t dtype,
         uintptr_t stream) {
        kernels::silu_mul(ptr<void>(out), ptr<const void>(x), n_tokens, ffn, as_dtype(dtype),
                          as_stream(stream));
      },
      py::arg("out"), py::arg("x"), py::arg("n_tokens"), py::arg("ffn"), py::arg("dtype"),
      py::arg("stream"));
  cu.def(
      "argmax",
      [](uintptr_t out, uintptr_t logits, int32_t rows, int32_t vocab, uintptr_t stream) {
        kernels::argmax(ptr<int32_t>(out), ptr<const float>(logits), rows, vocab,
                        as_stream(stream));
      },
      py::arg("out"), py::arg("logits"), py::arg("rows"), py::arg("vocab"), py::arg("stream"));
  cu.def(
      "sample",
      [](uintptr_t out, uintptr_t logits, uintptr_t temperature, uintptr_t top_k, uintptr_t top_p,
         uintptr_t min_p, uintptr_t seed, uintptr_t step, int32_t rows, int32_t vocab,
         uintptr_t stream) {
        kernels::SampleArgs a;
        a.out = ptr<int32_t>(out);
        a.logits = ptr<const float>(logits);
        a.temperature = ptr<const float>(temperature);
        a.top_k = ptr<const int32_t>(top_k);
        a.top_p = ptr<const float>(top_p);
        a.min_p = ptr<const float>(min_p);
        a.seed = ptr<const uint64_t>(seed);
        a.step = ptr<const uint64_t>(step);
        a.rows = rows;
        a.vocab = vocab;
        kernels::sample(a, as_stream(stream));
      },
      py::arg("out"), py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
      py::arg("min_p"), py::arg("seed"), py::arg("step"), py::arg("rows"), py::arg("vocab"),
      py::arg("stream"));
}

void bind_streams(py::module_& cu) {
  using cuda::StreamSet;
  py::class_<StreamSet>(cu, "StreamSet",
                        "Decode stream 0, prefill stream 1 and event 2 of the trace, on one GPU.")
      .def(py::init<int>(), py::arg("device") = 0)
      .def("create_stream", &StreamSet::create_stream)
      .def("create_event", &StreamSet::create_event)
      .def("record_event", &StreamSet::record_event, py::arg("event"), py::arg("stream"))
      .def("stream_wait_event", &StreamSet::stream_wait_event, py::arg("stream"), py::arg("event"))
      .def("synchronize", &StreamSet::synchronize, py::arg("stream"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "stream_handle",
          [](const StreamSet& s, int32_t id) { return reinterpret_cast<uintptr_t>(s.stream(id)); },
          py::arg("stream"), "The cudaStream_t as an integer, for torch.cuda.ExternalStream.")
      .def_property_readonly("device", &StreamSet::device)
      .def_property_readonly_static("DECODE", [](py::object) { return StreamSet::kDecodeStream; })
      .def_property_readonly_static("PREFILL", [](py::object) { return StreamSet::kPrefillStream; })
      .def_property_readonly_static("EVENT", [](py::object) { return StreamSet::kEvent; });
}
#endif

}  // namespace

void bind_cuda(py::module_& m) {
#ifdef MET_HAS_CUDA
  m.def(
      "has_cuda", [] { return true; }, "True when met._core was built with the CUDA kernels.");
  m.def(
      "cuda_device_count",
      [] {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) {
          cudaGetLastError();  // no driver or no GPU: clear the sticky error, report none
          return 0;
        }
        return n;
      },
      "GPUs the CUDA runtime sees (0 without a driver or GPU; never raises).");
  py::module_ cu = m.def_submodule("cuda", "met's CUDA kernels and streams (raw pointers).");
  bind_kernels(cu);
  bind_streams(cu);
#else
  m.def(
      "has_cuda", [] { return false; }, "True when met._core was built with the CUDA kernels.");
  m.def(
      "cuda_device_count", [] { return 0; }, "Always 0: this build has no CUDA.");
#endif
}

}  // namespace met::bindings
