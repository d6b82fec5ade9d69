// The recording fake's executor: slots, blocks and scripted logits rows; each plan it executes
// is recorded as the reference call the plan stands for.
#include "recording_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "recording_text.h"

namespace met::testing {
namespace {

float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f = 0;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

}  // namespace

std::string TraceBuffer::text() const {
  std::string out;
  for (const auto& l : lines_) out += l + "\n";
  return out;
}

RecordingBackend::RecordingBackend(FakeModelConfig cfg) : cfg_(std::move(cfg)) {}

// The fake has no streams: its stream and event calls are the trace hooks' lines.
DeviceInfo RecordingBackend::open() {
  DeviceInfo info;
  info.vocab = cfg_.vocab;
  info.block_size = cfg_.block_size;
  info.total_blocks = cfg_.total_blocks;
  info.prefill_stream = 1;
  info.prefill_event = next_event_++;
  return info;
}

void RecordingBackend::add_script(uint64_t request_id, Script script) {
  scripts_[request_id] = std::move(script);
}

const Script& RecordingBackend::script_for(const Sequence& seq) const {
  const uint64_t key = seq.session_hash != 0 ? seq.session_hash
                       : seq.tokens.empty()  ? 0
                                             : static_cast<uint64_t>(seq.tokens.front());
  auto it = scripts_.find(key);
  if (it == scripts_.end()) throw std::logic_error("fake: no script for s" + std::to_string(key));
  return it->second;
}

// The answer of a forward whose last input sits at absolute position `pos` (trace spec 2.4).
int32_t RecordingBackend::out_after(const Sequence& seq, int32_t pos) const {
  const Script& s = script_for(seq);
  const auto g = static_cast<size_t>(std::max(0, pos + 1 - s.prompt_len));
  return s.toks.at(std::min(g, s.toks.size() - 1));
}

// The script's token at absolute position `pos` (the output the request plans to have there).
int32_t RecordingBackend::script_at(const Sequence& seq, int32_t pos) const {
  const Script& s = script_for(seq);
  const auto g = static_cast<size_t>(std::max(0, pos - s.prompt_len));
  return s.toks.at(std::min(g, s.toks.size() - 1));
}

std::vector<SampledToken> RecordingBackend::sample_rows(const std::vector<SampleRow>& rows) {
  std::vector<SampledToken> out;
  for (const SampleRow& r : rows) {
    auto it = host_rows_.find(r.row);
    if (it == host_rows_.end()) throw std::logic_error("fake: row not copied to the host");
    std::vector<float> logits;
    for (uint16_t b : it->second) logits.push_back(bf16_to_float(b));
    if (r.mask_stop) {
      for (int32_t t : r.stop_tokens) logits.at(t) = -std::numeric_limits<float>::infinity();
    }
    // Ties go to the highest id. With 30.0-versus-0.0 rows a temperature sample always lands on
    // the argmax, so the fake never draws.
    size_t best = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (logits[i] >= logits[best]) best = i;
    }
    double z = 0;
    for (float v : logits) z += std::exp(static_cast<double>(v - logits[best]));
    SampledToken t;
    t.token = static_cast<int32_t>(best);
    t.logprob = static_cast<float>(-std::log(z));
    out.push_back(t);
  }
  return out;
}

int32_t RecordingBackend::take_slot() {
  if (free_slots_.empty()) return static_cast<int32_t>(next_slot_++);
  const int64_t s = free_slots_.back();
  free_slots_.pop_back();
  return static_cast<int32_t>(s);
}

void RecordingBackend::release_slot(int64_t slot) {
  free_slots_.push_back(slot);
  std::sort(free_slots_.rbegin(), free_slots_.rend());
}

void RecordingBackend::alloc_sequence(Sequence& seq, int32_t budget) {
  seq.slot = take_slot();
  if (budget < 0) {
    record("alloc_sequence() -> slot " + std::to_string(seq.slot));
  } else {
    record("alloc_sequence_for(budget=" + std::to_string(budget) + ") -> slot " +
           std::to_string(seq.slot));
  }
}

void RecordingBackend::free_sequence(Sequence& seq) {
  record("free_sequence(" + sid(seq) + ", blocks=" + std::to_string(seq.block_table.size()) + ")");
  used_blocks_ -= static_cast<int32_t>(seq.block_table.size());
  seq.block_table.clear();
  release_slot(seq.slot);
  seq.slot = kDetachedSlot;
}

void RecordingBackend::compact_sequence(Sequence& seq, int64_t new_slot) {
  record("compact_sequence(" + sid(seq) + ", new_slot=" + std::to_string(new_slot) + ")");
  if (seq.slot == new_slot) return;
  auto it = std::find(free_slots_.begin(), free_slots_.end(), new_slot);
  if (it == free_slots_.end()) throw std::logic_error("fake: compaction target is not free");
  free_slots_.erase(it);
  release_slot(seq.slot);
  seq.slot = new_slot;
}

int32_t RecordingBackend::num_free_blocks() {
  const int32_t f = std::max(0, cfg_.total_blocks - (used_blocks_ + cfg_.held_blocks));
  record("num_free_blocks() -> " + std::to_string(f));
  return f;
}

// The fake's block rule: tokens plus the next position; tables never shrink.
void RecordingBackend::grow_blocks(Sequence& seq) {
  const auto need = static_cast<size_t>(seq.seq_len / cfg_.block_size + 1);
  while (seq.block_table.size() < need) {
    seq.block_table.push_back(used_blocks_++);
  }
}

int32_t RecordingBackend::chunk(Sequence& seq, const std::vector<int32_t>& prompt, int32_t start,
                                int32_t len) {
  if (start == 0) seq.prompt_len = static_cast<int32_t>(prompt.size());
  seq.tokens.insert(seq.tokens.end(), prompt.begin() + start, prompt.begin() + start + len);
  seq.seq_len = start + len;
  grow_blocks(seq);
  return out_after(seq, seq.seq_len - 1);
}

int32_t RecordingBackend::decode_row(Sequence& seq, int32_t token) {
  const Script& s = script_for(seq);
  const auto generated = static_cast<int32_t>(seq.tokens.size()) - s.prompt_len;
  if (s.cancel_at >= 0 && generated == s.cancel_at && cancel_) cancel_(seq.session_hash);
  seq.tokens.push_back(token);
  ++seq.seq_len;
  grow_blocks(seq);
  return out_after(seq, seq.seq_len - 1);
}

std::string RecordingBackend::slice_text(const PrefillSlice& s) const {
  return sid(*s.seq) + " start=" + std::to_string(s.start) + " len=" + std::to_string(s.len) +
         " last=" + boolean(s.last);
}

void RecordingBackend::prefill(Sequence& seq, const std::vector<int32_t>& prompt, int32_t stream) {
  seq.tokens = prompt;
  seq.seq_len = static_cast<int32_t>(prompt.size());
  grow_blocks(seq);
  rows_ = {out_after(seq, seq.seq_len - 1)};
  host_rows_.clear();
  record("prefill(n=" + std::to_string(prompt.size()) + ", " + sid(seq) +
         ", stream=" + std::to_string(stream) + ")");
}

void RecordingBackend::prefill_chunk(Sequence& seq, const std::vector<int32_t>& prompt,
                                     int32_t start, int32_t len, bool last, int32_t stream) {
  rows_ = {chunk(seq, prompt, start, len)};
  host_rows_.clear();
  record("prefill_chunk(start=" + std::to_string(start) + ", len=" + std::to_string(len) +
         ", last=" + boolean(last) + ", " + sid(seq) + ", stream=" + std::to_string(stream) + ")");
}

void RecordingBackend::mixed_forward(const std::vector<Sequence*>& decode_seqs,
                                     const std::vector<int32_t>& decode_tokens,
                                     const PrefillSlice& slice, int32_t stream) {
  rows_.clear();
  host_rows_.clear();
  for (size_t i = 0; i < decode_seqs.size(); ++i) {
    rows_.push_back(decode_row(*decode_seqs[i], decode_tokens[i]));
  }
  rows_.push_back(chunk(*slice.seq, *slice.prompt, slice.start, slice.len));
  record("mixed_forward(decode=" + int_list(decode_tokens) + ", prefill=" + slice_text(slice) +
         ", stream=" + std::to_string(stream) + ")");
}

void RecordingBackend::mixed_forward_batch(const std::vector<Sequence*>& decode_seqs,
                                           const std::vector<int32_t>& decode_tokens,
                                           const std::vector<PrefillSlice>& slices,
                                           int32_t stream) {
  rows_.clear();
  host_rows_.clear();
  for (size_t i = 0; i < decode_seqs.size(); ++i) {
    rows_.push_back(decode_row(*decode_seqs[i], decode_tokens[i]));
  }
  std::vector<std::string> texts;
  for (const auto& s : slices) {
    rows_.push_back(chunk(*s.seq, *s.prompt, s.start, s.len));
    texts.push_back(slice_text(s));
  }
  record("mixed_forward_batch(decode=" + int_list(decode_tokens) +
         ", prefills=" + quoted_list(texts) + ", stream=" + std::to_string(stream) + ")");
}

void RecordingBackend::prefill_batch_chunk(const std::vector<PrefillSlice>& slices,
                                           int32_t stream) {
  rows_.clear();
  host_rows_.clear();
  std::vector<std::string> texts;
  for (const auto& s : slices) {
    rows_.push_back(chunk(*s.seq, *s.prompt, s.start, s.len));
    texts.push_back(slice_text(s));
  }
  record("prefill_batch_chunk(streams=" + quoted_list(texts) +
         ", stream=" + std::to_string(stream) + ")");
}

std::vector<int32_t> RecordingBackend::decode_batch(const std::vector<int32_t>& tokens,
                                                    const std::vector<Sequence*>& seqs,
                                                    int32_t stream, bool argmax) {
  std::vector<std::string> before;
  for (const Sequence* s : seqs) before.push_back(sid(*s));
  const std::string text = "decode_batch(tokens=" + int_list(tokens) +
                           ", seqs=" + quoted_list(before) + ", stream=" + std::to_string(stream) +
                           ")";
  const int32_t index = decode_calls_++;
  const auto& ex = cfg_.kv_exhaust_at;
  if (std::find(ex.begin(), ex.end(), index) != ex.end()) {
    record(text + " -> ERR KV cache exhausted");
    throw KvExhausted();
  }
  record(text);
  rows_.clear();
  host_rows_.clear();
  for (size_t i = 0; i < seqs.size(); ++i) rows_.push_back(decode_row(*seqs[i], tokens[i]));
  return argmax ? rows_ : std::vector<int32_t>{};
}

// One sequence's verify row (trace spec 2.4): position i answers the script after it, until an
// input past the first differs from the script at its own position; from there on every answer
// is GARBAGE (1), as a model fed a wrong draft token would answer nonsense.
void RecordingBackend::verify_row(Sequence& seq, const int32_t* tokens, int32_t n) {
  const Script& s = script_for(seq);
  const auto generated = static_cast<int32_t>(seq.tokens.size()) - s.prompt_len;
  if (s.cancel_at >= 0 && generated == s.cancel_at && cancel_) cancel_(seq.session_hash);
  bool garbage = false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t pos = seq.seq_len;
    if (i > 0 && tokens[i] != script_at(seq, pos)) garbage = true;
    seq.tokens.push_back(tokens[i]);
    ++seq.seq_len;
    rows_.push_back(garbage ? 1 : out_after(seq, pos));
  }
  grow_blocks(seq);
}

std::string RecordingBackend::verify_text(const std::vector<int32_t>& tokens,
                                          const std::vector<int32_t>& ks,
                                          const std::vector<Sequence*>& seqs) const {
  std::vector<std::string> before;
  for (const Sequence* s : seqs) before.push_back(sid(*s));
  return "tokens=" + int_list(tokens) + ", ks=" + int_list(ks) + ", seqs=" + quoted_list(before);
}

// Both kinds of verify forward count towards verify_exhaust_at.
bool RecordingBackend::verify_exhausted(const std::string& text) {
  const int32_t index = verify_calls_++;
  const auto& ex = cfg_.verify_exhaust_at;
  if (std::find(ex.begin(), ex.end(), index) == ex.end()) return false;
  record(text + " -> ERR KV cache exhausted");
  return true;
}

std::vector<int32_t> RecordingBackend::decode_verify_batched(const std::vector<int32_t>& tokens,
                                                             const std::vector<int32_t>& ks,
                                                             const std::vector<Sequence*>& seqs,
                                                             int32_t stream, bool argmax) {
  const std::string text = "decode_verify_batched(" + verify_text(tokens, ks, seqs) +
                           ", stream=" + std::to_string(stream) + ", woa=" + boolean(argmax) + ")";
  if (verify_exhausted(text)) throw KvExhausted();
  rows_.clear();
  host_rows_.clear();
  size_t off = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    verify_row(*seqs[i], tokens.data() + off, 1 + ks[i]);
    off += static_cast<size_t>(1 + ks[i]);
  }
  record(text + " -> " + int_list(argmax ? rows_ : std::vector<int32_t>{}));
  return argmax ? rows_ : std::vector<int32_t>{};
}

void RecordingBackend::mixed_verify_batch(const std::vector<int32_t>& tokens,
                                          const std::vector<int32_t>& ks,
                                          const std::vector<Sequence*>& seqs,
                                          const std::vector<PrefillSlice>& slices, int32_t stream) {
  // The verify sequences print as they were before the forward, the slices as after it (as
  // decode_verify_batched and mixed_forward_batch print them).
  const std::string head = "mixed_verify_batch(" + verify_text(tokens, ks, seqs);
  const auto tail = [&] {
    std::vector<std::string> texts;
    for (const auto& s : slices) texts.push_back(slice_text(s));
    return ", prefills=" + quoted_list(texts) + ", stream=" + std::to_string(stream) + ")";
  };
  if (verify_exhausted(head + tail())) throw KvExhausted();
  rows_.clear();
  host_rows_.clear();
  size_t off = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    verify_row(*seqs[i], tokens.data() + off, 1 + ks[i]);
    off += static_cast<size_t>(1 + ks[i]);
  }
  for (const auto& s : slices) rows_.push_back(chunk(*s.seq, *s.prompt, s.start, s.len));
  record(head + tail());
}

void RecordingBackend::commit_accepted_prefix(Sequence& seq, int32_t na, int32_t k) {
  const int32_t rejected = k + 1 - na;
  if (rejected < 0 || rejected > seq.seq_len) throw std::logic_error("fake: bad rollback");
  seq.seq_len -= rejected;
  seq.tokens.resize(seq.tokens.size() - static_cast<size_t>(rejected));
  record("commit_accepted_prefix(" + sid(seq) + ", na=" + std::to_string(na) +
         ", k=" + std::to_string(k) + ")");
}

// Reading a row the last forward did not produce is a scheduler bug, never a fallback.
int32_t RecordingBackend::checked_row(int32_t row) const {
  if (row < 0 || static_cast<size_t>(row) >= rows_.size()) {
    throw std::logic_error("fake: read of logits row " + std::to_string(row) +
                           " the last forward did not produce");
  }
  return rows_[static_cast<size_t>(row)];
}

int32_t RecordingBackend::argmax_on_device(int32_t row, int32_t stream) {
  const int32_t t = checked_row(row);
  record("argmax_on_device(row=" + std::to_string(row) + ", stream=" + std::to_string(stream) +
         ") -> " + std::to_string(t));
  return t;
}

std::vector<int32_t> RecordingBackend::argmax_batch(int32_t row, int32_t n, int32_t stream) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) out.push_back(checked_row(row + i));
  record("argmax_batch(row=" + std::to_string(row) + ", n=" + std::to_string(n) +
         ", stream=" + std::to_string(stream) + ") -> " + int_list(out));
  return out;
}

}  // namespace met::testing
