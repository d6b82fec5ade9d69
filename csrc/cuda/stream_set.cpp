#include "cuda/stream_set.h"

#include <stdexcept>
#include <string>

namespace met::cuda {

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("StreamSet ") + what + ": " + cudaGetErrorString(err));
  }
}

// Makes `device` current for one scope: the caller's thread keeps its own current device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

StreamSet::StreamSet(int device) : device_(device) {
  DeviceScope scope(device);
  try {
    for (cudaStream_t& s : streams_) {
      check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    }
    check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  } catch (...) {
    for (cudaStream_t s : streams_) {
      if (s) cudaStreamDestroy(s);
    }
    throw;
  }
}

StreamSet::~StreamSet() {
  // No throwing here: a failed switch only means the handles die with the process anyway.
  int previous = device_;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  cudaEventDestroy(event_);
  for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  cudaSetDevice(previous);
}

cudaStream_t StreamSet::stream(int32_t id) const {
  if (id != kDecodeStream && id != kPrefillStream) {
    throw std::out_of_range("StreamSet: no stream " + std::to_string(id));
  }
  return streams_[id];
}

cudaEvent_t StreamSet::event(int32_t id) const {
  if (id != kEvent) throw std::out_of_range("StreamSet: no event " + std::to_string(id));
  return event_;
}

void StreamSet::record_event(int32_t event, int32_t stream) {
  check(cudaEventRecord(this->event(event), this->stream(stream)), "cudaEventRecord");
}

void StreamSet::stream_wait_event(int32_t stream, int32_t event) {
  check(cudaStreamWaitEvent(this->stream(stream), this->event(event), 0), "cudaStreamWaitEvent");
}

void StreamSet::synchronize(int32_t stream) {
  check(cudaStreamSynchronize(this->stream(stream)), "cudaStreamSynchronize");
}

}  // namespace met::cuda
