// Owns: nothing; the shortcut by which the decode and verify steps of a C++ forward skip the
// device backend's language boundary (RowForward, DirectForward).
// Called by: the scheduler, as its device backend (the KvLedger wraps it); every call it does not
// take itself goes to the backend it wraps.
// Invariants: every decode and verify plan without a grammar row runs on the RowForward unless
// it cannot run it yet (RowForward::runs); its argmax readback is answered from that forward's
// argmax, its plain rows (SampleRow::plain_draw) are drawn by the RowForward where its logits
// are, and only its other sampled rows go to the wrapped backend with that forward's logits
// (sample_logits). A verify's rejected drafts reach the wrapped backend only when the RowForward
// keeps nothing per position to put back. Prefill plans, plans with a grammar row, and every
// sequence, stream and shutdown call reach the wrapped backend unchanged.
#pragma once

#include <cstdint>
#include <vector>

#include "met/backend.h"

namespace met {

// A forward the core can run on its own: the plan's rows, with block tables already covering
// their tokens (the KvLedger grew them), into the KV pool it was built on.
class RowForward {
 public:
  virtual ~RowForward() = default;
  // Every logits row's argmax, the rows laid out as StepPlan says.
  virtual std::vector<int32_t> argmax_rows(const StepPlan& plan) = 0;
  // The last run's logits rows, [rows, vocab()] floats, valid until the next run.
  virtual const float* logits() const = 0;
  virtual int64_t vocab() const = 0;
  // met's draw (csrc/kernels/sampling.cu's semantics) of each row's logits row `row` of the
  // last run; only for rows that plain_draw().
  virtual std::vector<int32_t> draw(const std::vector<SampleRow>& rows) = 0;
  // Whether it can run `plan` as things stand (a hybrid's forward: room to keep the state after
  // each token of its longest verify row); a plan it cannot run goes to the device backend.
  virtual bool runs(const StepPlan& /*plan*/) const { return true; }
  // A verify of `seq` kept its first `na` tokens: put back what the forward keeps per position
  // (a hybrid's recurrent state after token na). False: it keeps nothing of the kind and the
  // device backend is told instead.
  virtual bool put_back(const Sequence& /*seq*/, int32_t /*na*/) { return false; }
};

class DirectForward : public Backend {
 public:
  DirectForward(Backend& device, RowForward& forward) : device_(device), forward_(forward) {}

  DeviceInfo open() override { return device_.open(); }
  int32_t num_free_blocks() override { return device_.num_free_blocks(); }
  int32_t match_prefix(Sequence& seq, const std::vector<int32_t>& prompt) override {
    return device_.match_prefix(seq, prompt);
  }
  void alloc_sequence(Sequence& seq, int32_t budget) override {
    device_.alloc_sequence(seq, budget);
  }
  void free_sequence(Sequence& seq) override { device_.free_sequence(seq); }
  void compact_sequence(Sequence& seq, int64_t new_slot) override {
    device_.compact_sequence(seq, new_slot);
  }

  // A decode or verify plan without a grammar row that the RowForward runs() runs there; any
  // other on the device backend.
  std::vector<int32_t> execute(const StepPlan& plan) override;
  // The RowForward puts back what it keeps per position, or else the device backend does.
  void commit_accepted_prefix(Sequence& seq, int32_t na, int32_t k) override {
    if (!forward_.put_back(seq, na)) device_.commit_accepted_prefix(seq, na, k);
  }

  int32_t argmax_on_device(int32_t row, int32_t stream) override;
  std::vector<int32_t> argmax_batch(int32_t row, int32_t n, int32_t stream) override;
  std::vector<SampledToken> sample_rows(const std::vector<SampleRow>& rows) override;

  void join_streams(int32_t event, int32_t recorded, int32_t waiting) override {
    device_.join_streams(event, recorded, waiting);
  }
  void synchronize(int32_t stream) override { device_.synchronize(stream); }
  void teardown() override { device_.teardown(); }

  // Plans the RowForward ran, and those the device backend ran.
  int64_t direct_steps() const { return direct_steps_; }
  int64_t device_steps() const { return device_steps_; }

 private:
  bool takes(const StepPlan& plan) const;

  Backend& device_;
  RowForward& forward_;
  bool last_direct_ = false;  // the last forward ran here: its readback is `argmax_`
  std::vector<int32_t> argmax_;
  int64_t direct_steps_ = 0;
  int64_t device_steps_ = 0;
};

}  // namespace met
