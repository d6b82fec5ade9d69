// End of tick (trace spec 5.9: deadlines, retirement, compaction, resume) and shutdown (5.10).
#include <algorithm>
#include <utility>

#include "met/scheduler.h"
#include "scheduler_internal.h"

namespace met {

std::vector<int64_t> compaction_targets(const std::vector<int64_t>& slots,
                                        const std::vector<int64_t>& pinned) {
  const auto n = static_cast<int64_t>(slots.size());
  std::vector<int64_t> free_targets;  // highest first
  for (int64_t t = n - 1; t >= 0; --t) {
    const bool held = std::find(slots.begin(), slots.end(), t) != slots.end() ||
                      std::find(pinned.begin(), pinned.end(), t) != pinned.end();
    if (!held) free_targets.push_back(t);
  }
  std::vector<int64_t> targets(slots.size(), -1);
  size_t next = 0;
  for (size_t i = 0; i < slots.size() && next < free_targets.size(); ++i) {
    if (slots[i] >= n) targets[i] = free_targets[next++];
  }
  return targets;
}

void Scheduler::end_tick() {
  for (auto& l : active_) {
    if (!l->finished && l->req.has_deadline && now_ >= l->req.deadline) {
      l->finished = true;
      l->guard = "request_timeout";
    }
  }
  drop_cancelled();
  retire_finished();
  compact_slots();
  resume_requeued();
}

// Cancelled sequences that are not decoding have no client left to tell: a prefilling one frees
// its partial KV without offering it to the cache, a requeued one holds nothing (met's rule).
void Scheduler::drop_cancelled() {
  auto cancelled = [this](const LivePtr& l) { return cancelled_.count(l->req.id) != 0; };
  for (auto it = prefilling_.begin(); it != prefilling_.end();) {
    if (!cancelled(*it)) {
      ++it;
      continue;
    }
    fx_.apply(ReleaseSeq{&(*it)->seq, false, ReleaseWhy::FinishSequence});
    cancelled_.erase((*it)->req.id);
    it = prefilling_.erase(it);
  }
  for (auto it = requeued_.begin(); it != requeued_.end();) {
    if (!cancelled(*it)) {
      ++it;
      continue;
    }
    cancelled_.erase((*it)->req.id);
    it = requeued_.erase(it);
  }
}

void Scheduler::retire_finished() {
  for (auto it = active_.begin(); it != active_.end();) {
    Live& l = **it;
    if (!l.finished) {
      ++it;
      continue;
    }
    emit_done(l);
    fx_.apply(ReleaseSeq{&l.seq, true, ReleaseWhy::FinishSequence});
    cancelled_.erase(l.req.id);
    it = active_.erase(it);
  }
}

// Survivors move into the low slots so decode rows stay dense; slots of prefilling sequences are
// never targets (met's rule).
void Scheduler::compact_slots() {
  std::vector<int64_t> slots;
  for (const auto& l : active_) slots.push_back(l->seq.slot);
  std::vector<int64_t> pinned;
  for (const auto& l : prefilling_) pinned.push_back(l->seq.slot);
  const std::vector<int64_t> targets = compaction_targets(slots, pinned);
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] >= 0) fx_.apply(CompactSlot{&active_[i]->seq, targets[i]});
  }
}

// Oldest first; the first one that does not fit in the free blocks waits, with everything
// behind it, for a later tick.
void Scheduler::resume_requeued() {
  while (!requeued_.empty()) {
    Live& l = *requeued_.front();
    std::vector<int32_t> history = l.req.prompt;
    history.insert(history.end(), l.output.begin(), l.output.end() - 1);
    const auto h = static_cast<int32_t>(history.size());
    if (blocks_for(h, block_size_) > backend_.num_free_blocks()) return;
    l.seq = Sequence{};
    l.seq.session_hash = l.req.id;  // before alloc: the ledger's state slot is keyed by it
    backend_.alloc_sequence(l.seq, -1);
    l.seq.prompt_len = l.prompt_len();
    if (hooks_ != nullptr) hooks_->acquire_adapter_slot(kNoAdapter);
    announce(l.seq, h, 0, history);
    // The logits of this prefill are discarded: the pending token is already known.
    backend_.execute(
        {ReferenceCall::Prefill, kDecodeStream, {prefill_row(l.seq, history, 0, h, true)}});
    active_.push_back(std::move(requeued_.front()));
    requeued_.erase(requeued_.begin());
  }
}

// Shutdown is only planned when nothing is active, prefilling or requeued and the inbox is
// closed and empty, so there is no sequence left to finish or fail here.
void Scheduler::finish() {
  fx_.apply(EpShutdown{});
  fx_.apply(Quiesce{kDecodeStream});
  fx_.apply(Quiesce{prefill_stream_});
  fx_.apply(Teardown{});
}

// Finish reason precedence (trace spec 5.11): timeout guard, stop token, other guard, budget or
// context ceiling, else stop (a cancelled request).
void Scheduler::emit_done(const Live& l) {
  ClientEvent e;
  e.kind = ClientEvent::Kind::Done;
  e.request_id = l.req.id;
  const bool ended_on_stop = !l.output.empty() && is_stop(l, l.output.back());
  if (l.guard == "request_timeout") {
    e.finish_reason = "timeout";
  } else if (ended_on_stop) {
    e.finish_reason = "stop";
  } else if (!l.guard.empty() || l.remaining() <= 0 || at_ceiling(l)) {
    e.finish_reason = "length";
  } else {
    e.finish_reason = "stop";
  }
  e.n = static_cast<int32_t>(l.output.size());
  e.cached = l.cached;
  e.acc = l.acc;
  e.spec_off = l.spec_off;
  e.guard = l.guard;
  e.output = l.output;
  e.logprobs = l.logprobs;
  events_.push_back(std::move(e));
}

}  // namespace met
