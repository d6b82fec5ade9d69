// Python views of the plain boundary values. Sequence fields are read AND written by Python
// backends (tokens, seq_len, block_table, slot) through references the trampoline hands out;
// list fields are copied on read, so a backend assigns whole lists (seq.tokens = [...]).
#include "met/types.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstddef>

namespace py = pybind11;

namespace met::bindings {

void bind_types(py::module_& m) {
  m.attr("DETACHED_SLOT") = kDetachedSlot;

  py::class_<Sequence>(m, "Sequence")
      .def(py::init<>())
      .def_readwrite("session_hash", &Sequence::session_hash)
      .def_readwrite("slot", &Sequence::slot)
      .def_readwrite("seq_len", &Sequence::seq_len)
      .def_readwrite("prompt_len", &Sequence::prompt_len)
      .def_readwrite("tokens", &Sequence::tokens)
      .def_readwrite("block_table", &Sequence::block_table)
      .def_readwrite("cached_len", &Sequence::cached_len)
      .def_readwrite("state_slot", &Sequence::state_slot)
      // tokens[start:] without copying the rest out (a grammar syncs with the output only).
      .def(
          "tokens_from",
          [](const Sequence& s, size_t start) {
            const size_t from = std::min(start, s.tokens.size());
            return std::vector<int32_t>(s.tokens.begin() + static_cast<std::ptrdiff_t>(from),
                                        s.tokens.end());
          },
          py::arg("start"))
      .def("__repr__", [](const Sequence& s) {
        return "<Sequence s" + std::to_string(s.session_hash) + "@" + std::to_string(s.slot) +
               ":len=" + std::to_string(s.seq_len) + ">";
      });

  py::class_<SamplingParams>(m, "SamplingParams")
      .def(py::init<>())
      .def_readwrite("temperature", &SamplingParams::temperature)
      .def_readwrite("top_k", &SamplingParams::top_k)
      .def_readwrite("top_p", &SamplingParams::top_p)
      .def_readwrite("min_p", &SamplingParams::min_p)
      .def_readwrite("seed", &SamplingParams::seed)
      .def_readwrite("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_readwrite("presence_penalty", &SamplingParams::presence_penalty)
      .def_readwrite("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_readwrite("logit_bias", &SamplingParams::logit_bias)
      .def_readwrite("top_logprobs", &SamplingParams::top_logprobs)
      .def_readwrite("max_tokens", &SamplingParams::max_tokens)
      .def_readwrite("min_tokens", &SamplingParams::min_tokens)
      .def_readwrite("stop_token_ids", &SamplingParams::stop_token_ids)
      .def_readwrite("ignore_eos", &SamplingParams::ignore_eos)
      .def_readwrite("constrained", &SamplingParams::constrained)
      .def("greedy", &SamplingParams::greedy)
      .def("plain_argmax", &SamplingParams::plain_argmax)
      .def("wants_logprobs", &SamplingParams::wants_logprobs);

  py::class_<SampleRow>(m, "SampleRow")
      .def_readonly("request_id", &SampleRow::request_id)
      .def_readonly("row", &SampleRow::row)
      .def_property_readonly(
          "seq", [](const SampleRow& r) { return r.seq; }, py::return_value_policy::reference)
      .def_readonly("params", &SampleRow::params)
      .def_readonly("n_generated", &SampleRow::n_generated)
      .def_readonly("mask_stop", &SampleRow::mask_stop)
      .def_readonly("stop_tokens", &SampleRow::stop_tokens)
      .def_property_readonly("plain_draw", &SampleRow::plain_draw);

  py::class_<SampledToken>(m, "SampledToken")
      .def(py::init([](int32_t token, float logprob, std::vector<std::pair<int32_t, float>> top) {
             return SampledToken{token, logprob, std::move(top)};
           }),
           py::arg("token"), py::arg("logprob") = 0.0f,
           py::arg("top") = std::vector<std::pair<int32_t, float>>{})
      .def_readwrite("token", &SampledToken::token)
      .def_readwrite("logprob", &SampledToken::logprob)
      .def_readwrite("top", &SampledToken::top);
}

}  // namespace met::bindings
