// Binds met's sampling draw on the host: _core.cpu.sample (cpu::draw, the fast one every host
// draw uses) and _core.kernel_refs.sample (kernels::ref::sample, the sort-based reference the
// GPU kernel and cpu::draw are tested against), over the same per-row parameter arrays.
#include "cpu/sampling.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/reference/kernel_refs.h"

namespace py = pybind11;

namespace met::bindings {

namespace {

template <typename T>
using Array = py::array_t<T, py::array::c_style | py::array::forcecast>;

struct SampleArrays {
  Array<float> temperature;
  Array<int32_t> top_k;
  Array<float> top_p;
  Array<float> min_p;
  Array<uint64_t> seed;
  Array<uint64_t> step;

  void check(py::ssize_t rows) const {
    for (const py::ssize_t n :
         {temperature.size(), top_k.size(), top_p.size(), min_p.size(), seed.size(), step.size()}) {
      if (n != rows) throw py::value_error("every parameter array needs one entry per row");
    }
  }
  cpu::DrawParams row(py::ssize_t r) const {
    return {temperature.at(r), top_k.at(r), top_p.at(r), min_p.at(r), seed.at(r), step.at(r)};
  }
};

int32_t vocab_of(const Array<float>& logits) {
  if (logits.ndim() != 2) throw py::value_error("logits must be [rows, vocab]");
  return static_cast<int32_t>(logits.shape(1));
}

// cpu::draw_rows of logits rows `rows`, with the GIL released.
py::array_t<int32_t> sample(const Array<float>& logits, const Array<int64_t>& rows,
                            const SampleArrays& params) {
  const int32_t vocab = vocab_of(logits);
  params.check(rows.size());
  for (py::ssize_t r = 0; r < rows.size(); ++r) {
    if (rows.at(r) < 0 || rows.at(r) >= logits.shape(0)) {
      throw py::index_error("logits row " + std::to_string(rows.at(r)) + " of " +
                            std::to_string(logits.shape(0)));
    }
  }
  std::vector<cpu::DrawParams> each;
  for (py::ssize_t r = 0; r < rows.size(); ++r) each.push_back(params.row(r));
  py::array_t<int32_t> out(rows.size());
  int32_t* tokens = out.mutable_data();
  {
    py::gil_scoped_release released;
    cpu::draw_rows(logits.data(), vocab, rows.data(), each.data(),
                   static_cast<int32_t>(rows.size()), tokens);
  }
  return out;
}

py::array_t<int32_t> sample_ref(const Array<float>& logits, const SampleArrays& params) {
  const int32_t vocab = vocab_of(logits);
  params.check(logits.shape(0));
  py::array_t<int32_t> out(logits.shape(0));
  for (py::ssize_t r = 0; r < logits.shape(0); ++r) {
    const cpu::DrawParams p = params.row(r);
    const kernels::ref::SampleParams ref{p.temperature, p.top_k, p.top_p, p.min_p, p.seed, p.step};
    out.mutable_at(r) = kernels::ref::sample(logits.data() + r * vocab, vocab, ref);
  }
  return out;
}

}  // namespace

void bind_sampling(py::module_& m) {
  auto cpu = m.attr("cpu").cast<py::module_>();
  cpu.def(
      "sample",
      [](const Array<float>& logits, const Array<int64_t>& rows, Array<float> temperature,
         Array<int32_t> top_k, Array<float> top_p, Array<float> min_p, Array<uint64_t> seed,
         Array<uint64_t> step) {
        return sample(logits, rows, {temperature, top_k, top_p, min_p, seed, step});
      },
      py::arg("logits"), py::arg("rows"), py::arg("temperature"), py::arg("top_k"),
      py::arg("top_p"), py::arg("min_p"), py::arg("seed"), py::arg("step"),
      "met's draw (cpu::draw) of float32 logits [n, vocab] rows `rows`, one parameter entry per "
      "drawn row; int32 tokens");
  py::module_ refs = m.def_submodule("kernel_refs", "CPU references of the CUDA kernels.");
  refs.def(
      "sample",
      [](const Array<float>& logits, Array<float> temperature, Array<int32_t> top_k,
         Array<float> top_p, Array<float> min_p, Array<uint64_t> seed, Array<uint64_t> step) {
        return sample_ref(logits, {temperature, top_k, top_p, min_p, seed, step});
      },
      py::arg("logits"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
      py::arg("min_p"), py::arg("seed"), py::arg("step"),
      "kernels::ref::sample per row of float32 logits [rows, vocab]; int32 tokens.");
}

}  // namespace met::bindings
