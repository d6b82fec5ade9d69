// The speculative decode strategy: prompt-lookup drafts, one verify forward, the gate.
#include <algorithm>
#include <chrono>
#include <utility>

#include "met/scheduler.h"
#include "scheduler_internal.h"

namespace met {
namespace {

constexpr int32_t kMaxDraftPause = 16;

// A decode step in which every row with a draft carries 1 + k tokens (its pending token, then
// the draft) through one forward, next to plain rows (k = 0). Row outputs are read back exactly
// as a plain step would (device argmax, or each position sampled on the host with the request's
// own sampler at its own step), and accepted left to right while the model agrees with the
// draft: greedy and seeded output is the plain step's, token for token. When no row has a
// draft the step is the plain one, call for call.
class SpecDecode : public DecodeStrategy {
 public:
  explicit SpecDecode(const SpecConfig& cfg)
      : cfg_(cfg), gate_(cfg.gate), plain_(make_plain_decode()) {}

  void admit(Live& live) override {
    if (!live.spec_off.empty()) return;
    live.proposer = std::make_unique<NgramProposer>(cfg_.ngram);
  }

  void begin_tick(double now) override {
    if (pending_.valid && now > last_now_) {
      const double seconds = now - last_now_;
      gate_.observe(pending_.bucket, pending_.mode, pending_.verified, pending_.tokens, seconds);
      planner_.observe_step(pending_.rows, seconds);
    }
    pending_ = {};
    last_now_ = now;
  }

  void end_tick(bool continues) override {
    if (!continues) pending_ = {};
  }

  void step(Scheduler& sched, std::vector<Live*> rows, bool alone) override {
    const auto width = static_cast<int32_t>(rows.size());
    const int32_t bucket = SpecGate::bucket(width);
    const bool forced = cfg_.mode == SpecMode::NgramForced;
    const GateMode mode = forced ? GateMode::Spec : gate_.choose(bucket);
    const int32_t k = forced ? cfg_.k : SpecGate::draft_len(width, cfg_.k);
    std::vector<std::vector<int32_t>> drafts(rows.size());
    bool any = false;
    if (mode == GateMode::Spec && k > 0) any = propose(sched, rows, k, drafts);
    const int64_t before = delivered(rows);
    const bool verified = any && verify(sched, rows, drafts);
    if (!verified) {
      ++stats_.plain_steps;
      plain_->step(sched, rows, alone);
    }
    if (!forced) shadow_drafts(sched, rows, k);
    // Preempted rows delivered nothing; what the others delivered is what the step is worth.
    if (alone) {
      const auto tokens = static_cast<int32_t>(delivered(rows) - before);
      pending_ = {true, bucket, mode, verified, tokens, verified ? forward_rows(drafts) : width};
    }
  }

  // A fused step drafts as the bucket's current mode says (probes run in plain decode steps
  // only: a step sharing its tick with prefill work is never measured).
  Drafts fused_drafts(Scheduler& sched, const std::vector<Live*>& rows) override {
    const auto width = static_cast<int32_t>(rows.size());
    const bool forced = cfg_.mode == SpecMode::NgramForced;
    if (!forced && gate_.mode(SpecGate::bucket(width)) == GateMode::Plain) return {};
    const int32_t k = forced ? cfg_.k : SpecGate::draft_len(width, cfg_.k);
    Drafts drafts(rows.size());
    if (k <= 0 || !propose(sched, rows, k, drafts)) return {};
    return drafts;
  }

  void fused_accept(Scheduler& sched, const std::vector<Live*>& rows,
                    const Drafts& drafts) override {
    std::vector<int32_t> ks;
    int32_t n = 0;
    for (const auto& d : drafts) {
      ks.push_back(static_cast<int32_t>(d.size()));
      n += 1 + ks.back();
    }
    const Readback plan = sched.readback_plan(rows);
    std::vector<int32_t> argmax;
    if (plan == Readback::Argmax) argmax = sched.backend().argmax_batch(0, n, kDecodeStream);
    const std::vector<SampledToken> picks = read(sched, rows, ks, plan, std::move(argmax));
    ++stats_.verify_steps;
    ++stats_.fused_verify_steps;
    accept_all(sched, rows, drafts, picks);
    if (cfg_.mode != SpecMode::NgramForced) {
      shadow_drafts(sched, rows, SpecGate::draft_len(static_cast<int32_t>(rows.size()), cfg_.k));
    }
  }

  SpecStats stats() const override {
    SpecStats s = stats_;
    s.gate_switches = gate_.switches();
    s.gate_probes = gate_.probes();
    for (int32_t b = 0; b < 16; ++b) {
      if (gate_.mode(b) == GateMode::Plain) s.gate_plain_buckets.push_back(b);
    }
    return s;
  }

 private:
  struct Pending {
    bool valid = false;
    int32_t bucket = 0;
    GateMode mode = GateMode::Spec;
    bool verified = false;  // a verify forward ran (else the plain step, drafts or not)
    int32_t tokens = 0;
    int32_t rows = 0;  // rows of the step's forward (a verify row's every position)
  };

  static int32_t forward_rows(const Drafts& drafts) {
    int32_t n = 0;
    for (const auto& d : drafts) n += 1 + static_cast<int32_t>(d.size());
    return n;
  }

  static int64_t delivered(const std::vector<Live*>& rows) {
    int64_t n = 0;
    for (const Live* r : rows) n += static_cast<int64_t>(r->output.size());
    return n;
  }

  // A draft never reaches past max_tokens (the last token of a request is never a draft's
  // bonus) nor past the context: its k + 1 positions must all exist.
  static int32_t room(const Scheduler& sched, const Live& l, int32_t k) {
    const int32_t used = l.prompt_len() + static_cast<int32_t>(l.output.size());
    return std::max(0, std::min({k, l.remaining() - 1, sched.config().max_seq_len - used - 1}));
  }

  // The gated mode keeps of each proposal what the planner says pays; ngram-forced drafts
  // whole proposals, pausing a sequence after a draft rejected outright.
  bool propose(const Scheduler& sched, const std::vector<Live*>& rows, int32_t k, Drafts& drafts) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool forced = cfg_.mode == SpecMode::NgramForced;
    for (size_t i = 0; i < rows.size(); ++i) {
      Live& l = *rows[i];
      if (!l.proposer) continue;
      if (forced && l.draft_pause > 0) {
        --l.draft_pause;
        continue;
      }
      drafts[i] = l.proposer->propose({l.req.prompt, l.output}, room(sched, l, k));
    }
    if (!forced) plan(rows, drafts);
    stats_.proposer_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::any_of(drafts.begin(), drafts.end(), [](const auto& d) { return !d.empty(); });
  }

  void plan(const std::vector<Live*>& rows, Drafts& drafts) {
    std::vector<int32_t> proposed;
    std::vector<const DraftRecord*> records;
    for (size_t i = 0; i < rows.size(); ++i) {
      proposed.push_back(static_cast<int32_t>(drafts[i].size()));
      records.push_back(&rows[i]->drafts);
    }
    const std::vector<int32_t> keep = planner_.plan(proposed, records);
    for (size_t i = 0; i < rows.size(); ++i) {
      // A row that drafts for real is recorded by its verify; its shadow would count twice.
      if (keep[i] > 0) rows[i]->shadow.clear();
      stats_.withheld += proposed[i] - keep[i];
      drafts[i].resize(static_cast<size_t>(keep[i]));
    }
  }

  // After a step: each row's shadow draft is checked against the tokens decoded since it was
  // made (recorded once it is refused or has stood whole), and a row without one gets the
  // proposal the next step would start from. Costs one proposal per row, no forward.
  void shadow_drafts(const Scheduler& sched, const std::vector<Live*>& rows, int32_t k) {
    for (Live* l : rows) {
      if (!l->proposer || l->finished) continue;
      if (!l->shadow.empty()) check_shadow(*l);
      if (l->shadow.empty() && k > 0) {
        l->shadow = l->proposer->propose({l->req.prompt, l->output}, room(sched, *l, k));
        l->shadow_at = l->output.size();
      }
    }
  }

  void check_shadow(Live& l) {
    const size_t have = std::min(l.shadow.size(), l.output.size() - l.shadow_at);
    for (size_t j = 0; j < have; ++j) {
      if (l.output[l.shadow_at + j] != l.shadow[j]) {
        planner_.record(l.drafts, static_cast<int32_t>(j), true);
        l.shadow.clear();
        return;
      }
    }
    if (have == l.shadow.size()) {
      planner_.record(l.drafts, static_cast<int32_t>(have), false);
      l.shadow.clear();
    }
  }

  // False when the verify forward could not get its KV: nothing advanced, and the plain step
  // (which preempts on exhaustion) runs instead.
  bool verify(Scheduler& sched, const std::vector<Live*>& rows,
              const std::vector<std::vector<int32_t>>& drafts) {
    std::vector<int32_t> tokens, ks;
    std::vector<Sequence*> seqs;
    for (size_t i = 0; i < rows.size(); ++i) {
      seqs.push_back(&rows[i]->seq);
      tokens.push_back(rows[i]->pending);
      tokens.insert(tokens.end(), drafts[i].begin(), drafts[i].end());
      ks.push_back(static_cast<int32_t>(drafts[i].size()));
    }
    const Readback readback = sched.readback_plan(rows);
    StepPlan plan{ReferenceCall::DecodeVerifyBatched, kDecodeStream, verify_rows(tokens, ks, seqs)};
    plan.argmax = readback == Readback::Argmax;
    plan.grammar = Scheduler::any_grammar(rows);
    std::vector<int32_t> argmax;
    try {
      argmax = sched.backend().execute(plan);
    } catch (const KvExhausted&) {
      return false;
    }
    const std::vector<SampledToken> picks = read(sched, rows, ks, readback, std::move(argmax));
    ++stats_.verify_steps;
    accept_all(sched, rows, drafts, picks);
    return true;
  }

  void accept_all(Scheduler& sched, const std::vector<Live*>& rows, const Drafts& drafts,
                  const std::vector<SampledToken>& picks) {
    size_t base = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      accept(sched, *rows[i], drafts[i], picks, base);
      base += 1 + drafts[i].size();
    }
  }

  static std::vector<SampledToken> read(Scheduler& sched, const std::vector<Live*>& rows,
                                        const std::vector<int32_t>& ks, Readback plan,
                                        std::vector<int32_t> argmax) {
    std::vector<SampledToken> out;
    if (plan == Readback::Argmax) {
      for (int32_t t : argmax) out.push_back(SampledToken{t, 0.0f, {}});
      return out;
    }
    std::vector<SampleRow> srows;
    int32_t row = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int32_t j = 0; j <= ks[i]; ++j) srows.push_back(sched.sample_row(*rows[i], row++, j));
    }
    if (sched.hooks() != nullptr) sched.hooks()->copy_logits_to_host(0, row);
    return sched.backend().sample_rows(srows);
  }

  // Tokens are taken in order, each through the plain step's per-token processing (stop tokens,
  // max_tokens, context ceiling, cancellation), until one ends the request or differs from the
  // draft; then the sequence keeps the KV of the inputs that produced them and no more.
  void accept(Scheduler& sched, Live& l, const std::vector<int32_t>& draft,
              const std::vector<SampledToken>& picks, size_t base) {
    const auto k = static_cast<int32_t>(draft.size());
    int32_t taken = 0;
    bool rejected = false;
    for (int32_t j = 0; j <= k; ++j) {
      const size_t before = l.output.size();
      const SampledToken& tok = picks.at(base + static_cast<size_t>(j));
      sched.accept_token(l, tok);
      ++taken;
      if (l.finished || l.output.size() == before || j == k) break;
      if (tok.token != draft[static_cast<size_t>(j)]) {
        rejected = true;
        break;
      }
    }
    if (k == 0) return;
    ++stats_.verify_rows;
    stats_.drafted += k;
    stats_.accepted += taken - 1;
    l.acc += taken - 1;
    if (cfg_.mode != SpecMode::NgramForced) {
      planner_.record(l.drafts, taken - 1, rejected);
    } else if (taken == 1 && !l.finished) {
      l.draft_backoff = std::min(kMaxDraftPause, std::max(1, 2 * l.draft_backoff));
      l.draft_pause = l.draft_backoff;
    } else {
      l.draft_backoff = 0;
    }
    sched.backend().commit_accepted_prefix(l.seq, taken, k);
  }

  SpecConfig cfg_;
  SpecGate gate_;
  DraftPlanner planner_;
  std::unique_ptr<DecodeStrategy> plain_;
  SpecStats stats_;
  Pending pending_;
  double last_now_ = 0;
};

}  // namespace

std::unique_ptr<DecodeStrategy> make_spec_decode(const SpecConfig& cfg) {
  return std::make_unique<SpecDecode>(cfg);
}

}  // namespace met
