// Owns: the closed set of device effects the scheduler asks for beyond forwards (the `fx` lines of
// the trace spec, section 3) and the one place that applies them.
// Called by: the scheduler only; the applier then calls the Backend.
// Invariants: every effect goes through EffectApplier::apply, which writes its `fx` line to the
// trace sink (when there is one) *before* the backend or the trace hooks see any of its calls, so
// a recording backend that shares the sink interleaves both in true call order.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "met/backend.h"
#include "met/trace_hooks.h"
#include "met/types.h"

namespace met {

// Append-only line sink shared by the effect applier and (in tests) the recording backend.
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void line(const std::string& text) = 0;
};

// How a decode step's rows come back: device argmax, or a host copy for the sampler.
enum class Readback { Argmax, HostLogits };

// A plain decode step: one decode plan (the reference's decode_batch), a unified context commit
// per row, then the readback (a greedy step's argmax comes back with the forward).
struct LaunchDecode {
  std::vector<Sequence*> seqs;
  std::vector<int32_t> tokens;
  Readback readback = Readback::Argmax;
  bool grammar = false;  // StepPlan::grammar
};

// Who releases a sequence; printed in the fx line so traces show why a sequence went away.
enum class ReleaseWhy { FinishSequence, PreemptRequeue };

struct ReleaseSeq {
  Sequence* seq = nullptr;
  bool cache = true;  // offer the KV to the prefix cache first
  ReleaseWhy why = ReleaseWhy::FinishSequence;
};

struct CompactSlot {
  Sequence* seq = nullptr;
  int64_t target = 0;
};

struct MarconiCheckpoint {
  Sequence* seq = nullptr;
};

struct EpShutdown {};

struct Quiesce {
  int32_t stream = 0;
};

struct Teardown {};

using Effect = std::variant<LaunchDecode, ReleaseSeq, CompactSlot, MarconiCheckpoint, EpShutdown,
                            Quiesce, Teardown>;

// EP command words (trace spec section 7).
constexpr uint32_t kEpPrefillAnnounce = 0xfffffff0u;
constexpr uint32_t kEpReallocSlot = 0xfffffff1u;
constexpr uint32_t kEpShutdown = 0xffffffffu;

class EffectApplier {
 public:
  EffectApplier(Backend& backend, TraceSink* sink, TraceHooks* hooks)
      : backend_(backend), sink_(sink), hooks_(hooks) {}
  // Whether the backend has real streams to synchronize (DeviceInfo::streams).
  void set_streams(bool streams) { streams_ = streams; }

  // Returns the argmax tokens of a LaunchDecode with an Argmax readback, else nothing. A
  // LaunchDecode lets the backend's KvExhausted through (nothing advanced, nothing read back).
  std::vector<int32_t> apply(const Effect& fx);

 private:
  std::vector<int32_t> launch(const LaunchDecode& fx);
  void release(const ReleaseSeq& fx);

  Backend& backend_;
  TraceSink* sink_;
  TraceHooks* hooks_;
  bool streams_ = false;
};

}  // namespace met
