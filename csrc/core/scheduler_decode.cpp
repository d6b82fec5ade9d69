// Lane Decode (trace spec 5.6), per-token processing (5.7) and preemption on KV exhaustion.
#include <algorithm>
#include <utility>

#include "met/scheduler.h"
#include "scheduler_internal.h"

namespace met {
namespace {

// The plain decode step: one launch through the effect applier; on KV exhaustion one victim is
// requeued and the rest relaunched (each relaunch is a fresh launch with its own readback plan).
class PlainDecode : public DecodeStrategy {
 public:
  void step(Scheduler& sched, std::vector<Live*> rows, bool /*alone*/) override {
    while (!rows.empty()) {
      LaunchDecode launch;
      for (Live* row : rows) {
        launch.seqs.push_back(&row->seq);
        launch.tokens.push_back(row->pending);
      }
      launch.readback = sched.readback_plan(rows);
      launch.grammar = Scheduler::any_grammar(rows);
      std::vector<int32_t> argmax;
      try {
        argmax = sched.effects().apply(launch);
      } catch (const KvExhausted&) {
        auto victim = pick_victim(rows);
        sched.preempt(**victim);
        rows.erase(victim);
        continue;
      }
      const auto toks = sched.read_rows(rows, launch.readback, std::move(argmax));
      for (size_t i = 0; i < rows.size(); ++i) sched.accept_token(*rows[i], toks[i]);
      return;
    }
  }

 private:
  // Fewest generated tokens loses the least work; ties go to the lower slot.
  static std::vector<Live*>::iterator pick_victim(std::vector<Live*>& rows) {
    return std::min_element(rows.begin(), rows.end(), [](const Live* a, const Live* b) {
      if (a->output.size() != b->output.size()) return a->output.size() < b->output.size();
      return a->seq.slot < b->seq.slot;
    });
  }
};

}  // namespace

std::unique_ptr<DecodeStrategy> make_plain_decode() { return std::make_unique<PlainDecode>(); }

// With nothing unfinished to decode (every active sequence finished at once this tick) the lane
// issues nothing at all, not even the prefill-stream sync (met's rule).
void Scheduler::decode_lane(bool alone) {
  if (did_mixed_step_) return;
  std::vector<Live*> rows = decode_rows();
  if (rows.empty()) return;
  if (!prefilling_.empty()) sync_prefill_stream();
  decode_->step(*this, std::move(rows), alone);
}

// Decode rows are the unfinished active sequences in slot order (dense rows on the device).
std::vector<Live*> Scheduler::decode_rows() {
  if (active_.size() > 1) {
    std::stable_sort(active_.begin(), active_.end(),
                     [](const LivePtr& a, const LivePtr& b) { return a->seq.slot < b->seq.slot; });
  }
  std::vector<Live*> rows;
  for (auto& l : active_) {
    if (!l->finished) rows.push_back(l.get());
  }
  return rows;
}

bool Scheduler::any_grammar(const std::vector<Live*>& rows) {
  return std::any_of(rows.begin(), rows.end(),
                     [](const Live* row) { return row->req.params.constrained; });
}

Readback Scheduler::readback_plan(const std::vector<Live*>& rows) const {
  for (const Live* row : rows) {
    const SamplingParams& p = row->req.params;
    if (!p.plain_argmax() || p.wants_logprobs() || floor_active(*row)) return Readback::HostLogits;
  }
  return Readback::Argmax;
}

// Mixed steps read their decode rows back directly (no fx launch), with the same plan.
std::vector<SampledToken> Scheduler::read_back_direct(const std::vector<Live*>& rows) {
  const Readback plan = readback_plan(rows);
  const auto n = static_cast<int32_t>(rows.size());
  std::vector<int32_t> argmax;
  if (plan == Readback::Argmax) {
    argmax = backend_.argmax_batch(0, n, kDecodeStream);
  } else if (hooks_ != nullptr) {
    hooks_->copy_logits_to_host(0, n);
  }
  return read_rows(rows, plan, std::move(argmax));
}

std::vector<SampledToken> Scheduler::read_rows(const std::vector<Live*>& rows, Readback plan,
                                               std::vector<int32_t> argmax) {
  std::vector<SampledToken> out(rows.size());
  if (plan == Readback::Argmax) {
    for (size_t i = 0; i < rows.size(); ++i) out[i].token = argmax.at(i);
    return out;
  }
  std::vector<SampleRow> srows;
  for (size_t i = 0; i < rows.size(); ++i) {
    srows.push_back(sample_row(*rows[i], static_cast<int32_t>(i), 0));
  }
  return backend_.sample_rows(srows);
}

SampleRow Scheduler::sample_row(const Live& l, int32_t row, int32_t ahead) const {
  SampleRow sr;
  sr.request_id = l.req.id;
  sr.row = row;
  sr.seq = const_cast<Sequence*>(&l.seq);
  sr.params = l.req.params;
  sr.n_generated = static_cast<int32_t>(l.output.size()) + ahead;
  sr.mask_stop = floor_active(l, ahead);
  sr.stop_tokens = l.stop_tokens;
  return sr;
}

// A stop token ends the request and is counted but not streamed; under an active min_tokens
// floor it is dropped (it still becomes the next input, as the spec orders last_token first).
void Scheduler::accept_token(Live& live, const SampledToken& tok) {
  live.pending = tok.token;
  if (is_stop(live, tok.token)) {
    if (floor_active(live)) return;
    live.output.push_back(tok.token);
    live.finished = true;
    return;
  }
  live.output.push_back(tok.token);
  const bool with_logprobs = live.req.params.wants_logprobs();
  if (with_logprobs) ++live.logprobs;
  fx_.apply(MarconiCheckpoint{&live.seq});
  emit_token(live, tok, with_logprobs);
  if (live.remaining() <= 0 || at_ceiling(live)) live.finished = true;
  if (cancelled_.count(live.req.id) != 0) live.finished = true;
}

// The victim's KV goes away; its output, pending token and client stream stay, so a resume
// re-prefills prompt + output[:-1] and carries on (trace spec 5.9 step 3).
void Scheduler::preempt(Live& victim) {
  ++preemptions_;
  fx_.apply(ReleaseSeq{&victim.seq, true, ReleaseWhy::PreemptRequeue});
  auto it = std::find_if(active_.begin(), active_.end(),
                         [&victim](const LivePtr& l) { return l.get() == &victim; });
  requeued_.push_back(std::move(*it));
  active_.erase(it);
}

bool Scheduler::floor_active(const Live& live, int32_t ahead) const {
  return static_cast<int32_t>(live.output.size()) + ahead < live.req.params.min_tokens;
}

bool Scheduler::is_stop(const Live& live, int32_t token) const {
  return std::find(live.stop_tokens.begin(), live.stop_tokens.end(), token) !=
         live.stop_tokens.end();
}

void Scheduler::emit_token(const Live& live, const SampledToken& tok, bool with_logprobs) {
  if (!live.req.streaming) return;
  ClientEvent e;
  e.kind = ClientEvent::Kind::Token;
  e.request_id = live.req.id;
  e.token = tok;
  e.with_logprobs = with_logprobs;
  e.cached = live.cached;
  events_.push_back(std::move(e));
}

}  // namespace met
