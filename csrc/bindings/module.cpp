// The pybind11 module met._core: each concept binds itself in its own file.
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace met::bindings {
void bind_types(py::module_& m);
void bind_backend(py::module_& m);
void bind_scheduler(py::module_& m);
void bind_testing(py::module_& m);
void bind_block_manager(py::module_& m);
void bind_state_checkpoints(py::module_& m);
void bind_cuda(py::module_& m);
void bind_cpu_kernels(py::module_& m);
void bind_cpu_weights(py::module_& m);
void bind_cpu_model(py::module_& m);
void bind_sampling(py::module_& m);
}  // namespace met::bindings

PYBIND11_MODULE(_core, m) {
  m.doc() = "met core: scheduler, block manager, backend interface, recording fake";
  met::bindings::bind_types(m);
  met::bindings::bind_backend(m);
  met::bindings::bind_scheduler(m);
  met::bindings::bind_testing(m);
  met::bindings::bind_block_manager(m);
  met::bindings::bind_state_checkpoints(m);
  met::bindings::bind_cuda(m);
  met::bindings::bind_cpu_kernels(m);
  met::bindings::bind_cpu_weights(m);  // adds to the cpu submodule
  met::bindings::bind_cpu_model(m);
  met::bindings::bind_sampling(m);  // adds to the cpu submodule, and kernel_refs
}
