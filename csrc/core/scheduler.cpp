// The scheduler's driver, public API, and tick planning (drain, admission, snapshot).
#include "met/scheduler.h"

#include <algorithm>
#include <utility>

#include "scheduler_internal.h"

namespace met {

int32_t plan_chunk_len(int32_t off, int32_t total, int32_t proposed, int32_t block_size) {
  if (off + proposed >= total) return proposed;
  int32_t len = proposed;
  const int32_t end = off + proposed;
  const int32_t aligned = end - end % block_size;
  if (aligned > off) len = aligned - off;
  // Multiples of 4 keep the fused kernels' tiles full; shorter chunks are left alone.
  if (len >= 4) len -= len % 4;
  return len;
}

size_t admit_count(const std::vector<KvDemand>& in_flight, const std::vector<KvDemand>& incoming,
                   int32_t total_blocks, int32_t block_size, int32_t watermark) {
  int64_t reserved = 0;
  for (const auto& d : in_flight) {
    reserved += blocks_for(d.tokens + std::min(d.budget, watermark), block_size);
  }
  size_t admitted = 0;
  for (const auto& d : incoming) {
    const int32_t need = blocks_for(d.tokens + std::min(d.budget, watermark), block_size);
    const bool lone = in_flight.empty() && admitted == 0;
    if (!lone && reserved + need > total_blocks) break;
    reserved += need;
    ++admitted;
  }
  return admitted;
}

// Why a request cannot run with drafts (empty: it can). Penalties change every position's
// logits with the tokens accepted before it, so they cannot be evaluated over a verify row in
// one pass. A grammar can: the backend masks each draft position with the grammar advanced
// along the draft, and its matcher rolls back over the rejected positions.
std::string spec_off_reason(SpecMode mode, const SamplingParams& p) {
  if (mode == SpecMode::Off) return "off";
  if (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    return "penalties";
  }
  return "";
}

Scheduler::Scheduler(Backend& backend, SchedulerConfig cfg, TraceSink* sink, TraceHooks* hooks,
                     BlockManager* blocks, StatePool* states)
    : ledger_(blocks != nullptr ? std::make_unique<KvLedger>(backend, *blocks, states) : nullptr),
      backend_(ledger_ ? *ledger_ : backend),
      hooks_(hooks),
      cfg_(std::move(cfg)),
      fx_(backend_, sink, hooks),
      block_size_(0),
      prefill_stream_(0),
      prefill_event_(0),
      decode_(cfg_.spec.mode == SpecMode::Off ? make_plain_decode() : make_spec_decode(cfg_.spec)) {
  if (hooks_ != nullptr) hooks_->bind_gpu_to_thread();
  info_ = backend_.open();
  prefill_stream_ = info_.prefill_stream;
  prefill_event_ = info_.prefill_event;
  block_size_ = info_.block_size;
  fx_.set_streams(info_.streams);
  if (hooks_ != nullptr) {
    hooks_->stream_created(prefill_stream_);
    hooks_->event_created(prefill_event_);
  }
}

Scheduler::~Scheduler() = default;

void Scheduler::add_request(Request r) { inbox_.push_back(std::move(r)); }

// A request that has not started owns nothing on the device, so it just disappears; a started
// one is ended by the tick that next looks at it (trace spec 9.5).
void Scheduler::abort_request(uint64_t id) {
  auto drop = [id](std::deque<Request>& q) {
    auto it = std::find_if(q.begin(), q.end(), [id](const Request& r) { return r.id == id; });
    if (it == q.end()) return false;
    q.erase(it);
    return true;
  };
  if (drop(inbox_) || drop(queue_)) return;
  cancelled_.insert(id);
}

void Scheduler::close_inbox() { inbox_closed_ = true; }

bool Scheduler::has_work() const {
  return !inbox_.empty() || !queue_.empty() || !prefilling_.empty() || !active_.empty() ||
         !requeued_.empty();
}

std::vector<ClientEvent> Scheduler::take_events() { return std::exchange(events_, {}); }

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.running = static_cast<int32_t>(active_.size());
  s.prefilling = static_cast<int32_t>(prefilling_.size());
  s.waiting = static_cast<int32_t>(inbox_.size() + queue_.size());
  s.requeued = static_cast<int32_t>(requeued_.size());
  s.preemptions = preemptions_;
  return s;
}

SpecStats Scheduler::spec_stats() const { return decode_->stats(); }

TickResult Scheduler::tick(double now) {
  now_ = now;
  decode_->begin_tick(now);
  Plan plan = plan_tick();
  if (plan.shutdown) {
    finish();
    return {true};
  }
  // Prefill work or a resume shares this tick's wall time with the decode step.
  const bool alone = plan.admitted.empty() && prefilling_.empty() && requeued_.empty();
  for (auto& r : plan.admitted) start_prefill(std::move(r));
  if (continue_prefills() == Lane::SkipRest) {
    decode_->end_tick(false);
    return {false};
  }
  decode_lane(alone);
  end_tick();
  decode_->end_tick(!active_.empty());
  return {false};
}

bool Scheduler::idle() const { return active_.empty() && prefilling_.empty() && requeued_.empty(); }

Scheduler::Plan Scheduler::plan_tick() {
  Plan plan;
  absorb_inbox();
  const auto busy = static_cast<int32_t>(active_.size() + prefilling_.size());
  const auto cap = static_cast<size_t>(std::max(0, cfg_.max_batch_size - busy));
  std::vector<Request> taken;
  while (!queue_.empty() && taken.size() < cap) {
    taken.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  if (!taken.empty()) plan.admitted = admit(std::move(taken));
  // The per-tick status snapshot: nothing in met reads it, a recording backend marks ticks on it.
  if (hooks_ != nullptr) hooks_->status_snapshot();
  if (plan.admitted.empty() && idle()) {
    absorb_inbox();
    plan.shutdown = inbox_closed_ && queue_.empty();
  }
  return plan;
}

// Requests the scheduler can never serve fail here, before they own anything on the device.
void Scheduler::absorb_inbox() {
  while (!inbox_.empty()) {
    Request r = std::move(inbox_.front());
    inbox_.pop_front();
    if (r.prompt.empty() || static_cast<int32_t>(r.prompt.size()) >= cfg_.max_seq_len) {
      ClientEvent e;
      e.kind = ClientEvent::Kind::Error;
      e.request_id = r.id;
      e.error = r.prompt.empty() ? "empty prompt" : "prompt longer than max_seq_len";
      events_.push_back(std::move(e));
      continue;
    }
    queue_.push_back(std::move(r));
  }
}

// Adapter cohort filter (one lookup for the cohort, one per request; met has no LoRA yet, so
// every slot is kNoAdapter), then the KV gate. Held-back requests go back to the queue front.
std::vector<Request> Scheduler::admit(std::vector<Request> taken) {
  if (hooks_ != nullptr) {
    hooks_->adapter_id_for(kNoAdapter);
    for (size_t i = 0; i < taken.size(); ++i) hooks_->adapter_id_for(kNoAdapter);
  }
  std::vector<KvDemand> in_flight;
  for (const auto* list : {&active_, &prefilling_, &requeued_}) {
    for (const auto& l : *list) {
      const auto now_tokens = static_cast<int32_t>(l->req.prompt.size() + l->output.size());
      in_flight.push_back({now_tokens, std::max(0, l->remaining())});
    }
  }
  std::vector<KvDemand> incoming;
  for (const auto& r : taken) {
    incoming.push_back({static_cast<int32_t>(r.prompt.size()), r.params.max_tokens});
  }
  const size_t n =
      admit_count(in_flight, incoming, info_.total_blocks, block_size_, cfg_.max_seq_len);
  for (size_t i = taken.size(); i > n; --i) queue_.push_front(std::move(taken[i - 1]));
  taken.resize(n);
  return taken;
}

Scheduler::LivePtr Scheduler::make_live(Request r) const {
  auto live = std::make_unique<Live>();
  if (!r.params.ignore_eos) live->stop_tokens = cfg_.eos_tokens;
  for (int32_t t : r.params.stop_token_ids) live->stop_tokens.push_back(t);
  live->spec_off = spec_off_reason(cfg_.spec.mode, r.params);
  live->req = std::move(r);
  return live;
}

bool Scheduler::at_ceiling(const Live& live) const {
  return live.prompt_len() + static_cast<int32_t>(live.output.size()) >= cfg_.max_seq_len;
}

}  // namespace met
