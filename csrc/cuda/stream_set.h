// Owns: the CUDA streams and the event behind the backend's stream/event calls: the decode
// stream (trace id 0), the prefill stream (id 1) and the one event (id 2).
// Called by: bindings/cuda.cpp (_core.cuda.StreamSet); the torch backend wraps stream(id) in
// torch.cuda.ExternalStream so its matmuls and met's kernels share the same queues.
// Invariants: both streams are non-blocking (no implicit ordering with the legacy default
// stream), so prefill and decode work is ordered only by record_event / stream_wait_event, as
// the trace shows. Ids other than 0, 1 (streams) and 2 (event) are rejected. Not copyable;
// the destructor releases the handles on the device they were created on.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace met::cuda {

class StreamSet {
 public:
  static constexpr int32_t kDecodeStream = 0;
  static constexpr int32_t kPrefillStream = 1;
  static constexpr int32_t kEvent = 2;

  explicit StreamSet(int device = 0);
  ~StreamSet();
  StreamSet(const StreamSet&) = delete;
  StreamSet& operator=(const StreamSet&) = delete;

  // The trace's create calls: the handles exist from construction; these name them.
  int32_t create_stream() const { return kPrefillStream; }
  int32_t create_event() const { return kEvent; }

  void record_event(int32_t event, int32_t stream);
  void stream_wait_event(int32_t stream, int32_t event);
  void synchronize(int32_t stream);

  cudaStream_t stream(int32_t id) const;
  cudaEvent_t event(int32_t id) const;
  int device() const { return device_; }

 private:
  int device_;
  cudaStream_t streams_[2] = {nullptr, nullptr};
  cudaEvent_t event_ = nullptr;
};

}  // namespace met::cuda
