#include "met/effects.h"

#include <string>
#include <type_traits>

namespace met {
namespace {

const char* readback_name(Readback r) { return r == Readback::Argmax ? "Argmax" : "HostLogits"; }

const char* why_name(ReleaseWhy w) {
  return w == ReleaseWhy::FinishSequence ? "finish_sequence" : "preempt_requeue";
}

// The decorator's label for each effect; the golden trace fixes the spelling.
std::string label(const Effect& fx) {
  return std::visit(
      [](const auto& e) -> std::string {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, LaunchDecode>) {
          // ctx is always Unified: met commits the decode context row by row after every step.
          return "fx launch Decode{n=" + std::to_string(e.seqs.size()) +
                 ", ctx=Unified, readback=" + readback_name(e.readback) + "}";
        } else if constexpr (std::is_same_v<T, ReleaseSeq>) {
          return std::string("fx apply ReleaseSeq{cache=") + (e.cache ? "true" : "false") + ", " +
                 why_name(e.why) + "}";
        } else if constexpr (std::is_same_v<T, CompactSlot>) {
          return "fx apply CompactSlot{target=" + std::to_string(e.target) + "}";
        } else if constexpr (std::is_same_v<T, MarconiCheckpoint>) {
          return "fx apply MarconiCheckpoint";
        } else if constexpr (std::is_same_v<T, EpShutdown>) {
          return "fx apply EpShutdown";
        } else if constexpr (std::is_same_v<T, Quiesce>) {
          return "fx apply Quiesce{stream=" + std::to_string(e.stream) + "}";
        } else {
          static_assert(std::is_same_v<T, Teardown>);
          return "fx teardown";
        }
      },
      fx);
}

}  // namespace

std::vector<int32_t> EffectApplier::apply(const Effect& fx) {
  if (sink_ != nullptr) sink_->line(label(fx));
  if (const auto* launch_fx = std::get_if<LaunchDecode>(&fx)) return launch(*launch_fx);
  if (const auto* release_fx = std::get_if<ReleaseSeq>(&fx)) {
    release(*release_fx);
  } else if (const auto* compact = std::get_if<CompactSlot>(&fx)) {
    backend_.compact_sequence(*compact->seq, compact->target);
  } else if (const auto* ckpt = std::get_if<MarconiCheckpoint>(&fx)) {
    if (hooks_ != nullptr) hooks_->decode_marconi_checkpoint(*ckpt->seq);
  } else if (std::holds_alternative<EpShutdown>(fx)) {
    if (hooks_ != nullptr) hooks_->ep_broadcast_cmd_for_seq(0, kEpShutdown);
  } else if (const auto* quiesce = std::get_if<Quiesce>(&fx)) {
    if (streams_) backend_.synchronize(quiesce->stream);
    if (hooks_ != nullptr) hooks_->stream_synchronized(quiesce->stream);
  } else {
    backend_.teardown();
    if (hooks_ != nullptr) hooks_->torn_down();
  }
  return {};
}

// The decode stream is the default stream 0; the prefill stream only ever carries prefills.
std::vector<int32_t> EffectApplier::launch(const LaunchDecode& fx) {
  constexpr int32_t kDecodeStream = 0;
  StepPlan plan;
  plan.call = ReferenceCall::DecodeBatch;
  plan.stream = kDecodeStream;
  for (size_t i = 0; i < fx.seqs.size(); ++i) {
    plan.rows.push_back(decode_row(*fx.seqs[i], fx.tokens[i]));
  }
  plan.argmax = fx.readback == Readback::Argmax;
  plan.grammar = fx.grammar;
  std::vector<int32_t> argmax = backend_.execute(plan);
  if (hooks_ == nullptr) return argmax;
  const auto n = static_cast<int32_t>(fx.seqs.size());
  for (int32_t i = 0; i < n; ++i) {
    const Sequence& seq = *fx.seqs[static_cast<size_t>(i)];
    hooks_->commit_ctx(seq, 1, seq.seq_len - 1, i);
  }
  if (plan.argmax) {
    hooks_->argmax_batch(0, n, kDecodeStream, argmax);
  } else {
    hooks_->copy_logits_to_host(0, n);
  }
  return argmax;
}

// The worker ranks mirror slots, so they learn the *old* slot is free again.
void EffectApplier::release(const ReleaseSeq& fx) {
  const auto old_slot = static_cast<uint32_t>(fx.seq->slot);
  if (fx.cache && hooks_ != nullptr) hooks_->cache_sequence(*fx.seq);
  backend_.free_sequence(*fx.seq);
  if (hooks_ != nullptr) hooks_->ep_broadcast_cmd_for_seq(old_slot, kEpReallocSlot);
}

}  // namespace met
