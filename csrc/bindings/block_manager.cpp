// Binds met::BlockManager as met._core.BlockManager and met::StatePool as met._core.StatePool.
// Token arguments take any int sequence: a C-contiguous int32 numpy array is read in place (no
// copy), a list is converted once.
// check_invariants raises RuntimeError (std::logic_error); bad arguments raise ValueError.
#include "met/block_manager.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "met/state_pool.h"

namespace py = pybind11;

namespace met::bindings {

namespace {
using TokenArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

const int32_t* tokens_ptr(const TokenArray& a) {
  if (a.ndim() != 1) throw py::value_error("token ids must be a 1-D sequence");
  return a.data();
}
}  // namespace

void bind_state_pool(py::module_& m) {
  py::class_<StatePool>(m, "StatePool",
                        "A hybrid model's recurrent-state slots, one per live sequence.")
      .def(py::init<int32_t>(), py::arg("num_slots"))
      .def("allocate", &StatePool::allocate, py::arg("seq"))
      .def("release", &StatePool::release, py::arg("seq"))
      .def("has", &StatePool::has, py::arg("seq"))
      .def("slot", &StatePool::slot, py::arg("seq"))
      .def("num_slots", &StatePool::num_slots)
      .def("num_free", &StatePool::num_free)
      .def("check_invariants", &StatePool::check_invariants);
}

void bind_block_manager(py::module_& m) {
  bind_state_pool(m);
  py::class_<BlockManager>(m, "BlockManager",
                           "Paged KV blocks with ref counts, an LRU free list and a prefix cache.")
      .def(py::init<int32_t, int32_t, bool, bool>(), py::arg("num_blocks"), py::arg("block_size"),
           py::arg("enable_prefix_cache") = true, py::arg("reuse_before_fresh") = false)
      .def(
          "allocate_prefix",
          [](BlockManager& bm, uint64_t seq, const TokenArray& prompt) {
            return bm.allocate_prefix(seq, tokens_ptr(prompt), static_cast<size_t>(prompt.size()));
          },
          py::arg("seq"), py::arg("prompt"),
          "Create seq's table from cached prefix blocks; returns the cached token count.")
      .def("grow", &BlockManager::grow, py::arg("seq"), py::arg("num_tokens"),
           "Cover num_tokens positions; False (and no change) when blocks run out.")
      .def(
          "commit",
          [](BlockManager& bm, uint64_t seq, const TokenArray& tokens) {
            bm.commit(seq, tokens_ptr(tokens), static_cast<size_t>(tokens.size()));
          },
          py::arg("seq"), py::arg("tokens"),
          "Register the hashes of newly completed full blocks; tokens = all KV-written tokens.")
      .def("rollback", &BlockManager::rollback, py::arg("seq"), py::arg("num_tokens"),
           "After a verify: seq holds num_tokens valid tokens; its blocks stay for overwriting.")
      .def("release", &BlockManager::release, py::arg("seq"))
      .def("reset_prefix_cache", &BlockManager::reset_prefix_cache)
      .def(
          "table", [](const BlockManager& bm, uint64_t seq) { return bm.table(seq); },
          py::arg("seq"), "A copy of seq's block table, as a list.")
      .def("has", &BlockManager::has, py::arg("seq"))
      .def("num_free_blocks", &BlockManager::num_free_blocks)
      .def("num_touched_blocks", &BlockManager::num_touched_blocks)
      .def("num_total_blocks", &BlockManager::num_total_blocks)
      .def("block_size", &BlockManager::block_size)
      .def("num_used_blocks", &BlockManager::num_used_blocks)
      .def("num_cached_blocks", &BlockManager::num_cached_blocks)
      .def("prefix_cache_enabled", &BlockManager::prefix_cache_enabled)
      .def("ref_count", &BlockManager::ref_count, py::arg("block"))
      .def("prefix_queried_tokens", &BlockManager::prefix_queried_tokens)
      .def("prefix_hit_tokens", &BlockManager::prefix_hit_tokens)
      .def("check_invariants", &BlockManager::check_invariants)
      .def("__repr__", [](const BlockManager& bm) {
        return "BlockManager(total=" + std::to_string(bm.num_total_blocks()) +
               ", used=" + std::to_string(bm.num_used_blocks()) +
               ", free=" + std::to_string(bm.num_free_blocks()) +
               ", cached=" + std::to_string(bm.num_cached_blocks()) +
               ", block_size=" + std::to_string(bm.block_size()) + ")";
      });
}

}  // namespace met::bindings
