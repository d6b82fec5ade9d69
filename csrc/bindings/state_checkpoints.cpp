// Binds met::StateCheckpoints as met._core.StateCheckpoints, with the ResumedPrefix and
// CheckpointCopy values it answers in. check_invariants raises RuntimeError (std::logic_error);
// a bad shape raises ValueError.
#include "met/state_checkpoints.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;

namespace met::bindings {

void bind_state_checkpoints(py::module_& m) {
  py::class_<ResumedPrefix>(m, "ResumedPrefix",
                            "A resumed prompt: its cached positions and the checkpoint to restore.")
      .def_readonly("length", &ResumedPrefix::length)
      .def_readonly("index", &ResumedPrefix::index);
  py::class_<CheckpointCopy>(m, "CheckpointCopy",
                             "Checkpoint `index` takes state slot `slot`'s state: as it is now "
                             "(token < 0), or after token `token` of its last verify row.")
      .def_readonly("index", &CheckpointCopy::index)
      .def_readonly("slot", &CheckpointCopy::slot)
      .def_readonly("token", &CheckpointCopy::token);
  py::class_<StateCheckpoints>(m, "StateCheckpoints",
                               "A hybrid model's recurrent-state checkpoints for its prefix cache, "
                               "keyed by the block manager's hashes and evicted with its blocks.")
      .def(py::init<BlockManager&, int32_t, int32_t>(), py::arg("blocks"), py::arg("count"),
           py::arg("interval"), py::keep_alive<1, 2>())
      .def("resume", &StateCheckpoints::resume, py::arg("seq"), py::arg("prompt"))
      .def("plan", &StateCheckpoints::plan, py::arg("plan"), py::arg("history_ends"))
      .def("commit", &StateCheckpoints::commit, py::arg("plan"))
      .def("abandon", &StateCheckpoints::abandon)
      .def("forget", &StateCheckpoints::forget, py::arg("seq"))
      .def("count", &StateCheckpoints::count)
      .def("num_indexed", &StateCheckpoints::num_indexed)
      .def("num_free", &StateCheckpoints::num_free)
      .def("check_invariants", &StateCheckpoints::check_invariants);
}

}  // namespace met::bindings
