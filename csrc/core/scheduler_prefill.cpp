// Lanes StartPrefills and ContinuePrefills (trace spec 5.4, 5.5) and first-token sampling (5.8).
#include <algorithm>
#include <utility>

#include "met/scheduler.h"
#include "scheduler_internal.h"

namespace met {

// Chunk 0 of a new request is always a standalone forward; only continuation chunks are fused
// with decode rows.
void Scheduler::start_prefill(Request r) {
  LivePtr live = make_live(std::move(r));
  Sequence& seq = live->seq;
  const std::vector<int32_t>& prompt = live->req.prompt;
  const int32_t total = live->prompt_len();
  const bool chunked = cfg_.max_prefill_tokens > 0;
  seq.session_hash = live->req.id;  // before alloc: the ledger's state slot is keyed by it
  backend_.alloc_sequence(seq, chunked ? total + live->req.params.max_tokens : -1);
  seq.prompt_len = total;
  const int32_t cached = backend_.match_prefix(seq, prompt);
  live->cached = cached == kMatchInCore ? 0 : cached;  // no block manager: no prefix cache
  live->offset = live->cached;
  if (hooks_ != nullptr) {
    hooks_->adapter_id_for(kNoAdapter);
    hooks_->acquire_adapter_slot(kNoAdapter);
  }
  if (!chunked) {
    const int32_t off = live->offset;
    announce(seq, total - off, off, prompt);
    backend_.execute({ReferenceCall::Prefill,
                      kDecodeStream,
                      {prefill_row(seq, prompt, off, total - off, true)}});
    live->offset = total;
    const SampledToken tok = first_token(*live, 0);
    promote(std::move(live), tok);
    return;
  }
  const bool alone = active_.empty() && prefilling_.empty();
  const int32_t budget = alone ? cfg_.max_batch_tokens : cfg_.max_prefill_tokens;
  const int32_t off = live->offset;
  const int32_t len = plan_chunk_len(off, total, std::min(total - off, budget), block_size_);
  const bool last = off + len >= total;
  announce(seq, len, off, prompt);
  backend_.execute(
      {ReferenceCall::PrefillChunk, prefill_stream_, {prefill_row(seq, prompt, off, len, last)}});
  live->offset += len;
  sync_prefill_stream();
  if (!last) {
    prefilling_.push_back(std::move(live));
    return;
  }
  const SampledToken tok = first_token(*live, 0);
  promote(std::move(live), tok);
}

Scheduler::Lane Scheduler::continue_prefills() {
  did_mixed_step_ = false;
  if (!prefilling_.empty()) {
    const bool decoding = !decode_rows().empty();
    if (prefilling_.size() >= 2) {
      batched_step();
    } else if (decoding) {
      single_mixed_step();
    } else {
      head_chunk_step();
    }
  }
  if (active_.empty()) resume_requeued();
  return active_.empty() ? Lane::SkipRest : Lane::Continue;
}

// Every prefilling stream advances one chunk in one forward, fused with the decode rows when
// there are any (mixed_forward_batch), else on its own (prefill_batch_chunk).
void Scheduler::batched_step() {
  if (hooks_ != nullptr) hooks_->poll_innerq();
  std::vector<Live*> rows = decode_rows();
  std::vector<PrefillSlice> slices;
  for (auto& p : prefilling_) slices.push_back(next_slice(*p));
  Drafts drafts;
  int32_t n_decode = 0;
  if (rows.empty()) {
    std::vector<PlanRow> chunks;
    for (const auto& s : slices) chunks.push_back(slice_row(s));
    backend_.execute({ReferenceCall::PrefillBatchChunk, prefill_stream_, std::move(chunks)});
  } else {
    drafts = decode_->fused_drafts(*this, rows);
    n_decode = fused_forward(rows, slices, false, drafts);
  }
  sync_prefill_stream();
  std::vector<SampledToken> firsts(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    prefilling_[i]->offset += slices[i].len;
    if (slices[i].last)
      firsts[i] = first_token(*prefilling_[i], n_decode + static_cast<int32_t>(i));
  }
  if (!rows.empty()) {
    read_fused(rows, drafts);
    did_mixed_step_ = true;
  }
  // Completed prefills join `active` last-first; harmless, decode re-sorts by slot.
  for (size_t i = slices.size(); i-- > 0;) {
    if (!slices[i].last) continue;
    LivePtr done = std::move(prefilling_[i]);
    prefilling_.erase(prefilling_.begin() + static_cast<std::ptrdiff_t>(i));
    promote(std::move(done), firsts[i]);
  }
}

// One prefilling stream next to decode rows: one mixed_forward, the prefill row last.
void Scheduler::single_mixed_step() {
  if (hooks_ != nullptr) hooks_->poll_innerq();
  std::vector<Live*> rows = decode_rows();
  Live& head = *prefilling_.front();
  const PrefillSlice slice = next_slice(head);
  Drafts drafts = decode_->fused_drafts(*this, rows);
  const int32_t n_decode = fused_forward(rows, {slice}, true, drafts);
  head.offset += slice.len;
  SampledToken first;
  if (slice.last) {
    sync_prefill_stream();
    first = first_token(head, n_decode);
  }
  sync_prefill_stream();
  read_fused(rows, drafts);
  did_mixed_step_ = true;
  if (slice.last) {
    LivePtr done = std::move(prefilling_.front());
    prefilling_.erase(prefilling_.begin());
    promote(std::move(done), first);
  }
}

// Nothing decoding: the head chunk runs alone, announced to the workers like a first chunk
// (met's rule: the same words (len, start, total) and the whole prompt).
void Scheduler::head_chunk_step() {
  if (hooks_ != nullptr) hooks_->poll_innerq();
  Live& head = *prefilling_.front();
  const PrefillSlice slice = next_slice(head);
  announce(head.seq, slice.len, slice.start, head.req.prompt);
  backend_.execute({ReferenceCall::PrefillChunk, prefill_stream_, {slice_row(slice)}});
  if (hooks_ != nullptr) hooks_->normalize_ssm_states(head.seq, prefill_stream_);
  head.offset += slice.len;
  if (!slice.last) return;
  sync_prefill_stream();
  const SampledToken first = first_token(head, 0);
  LivePtr done = std::move(prefilling_.front());
  prefilling_.erase(prefilling_.begin());
  promote(std::move(done), first);
}

// The forward of a tick that continues prefills, the decode rows fused in: with drafts a verify
// forward, which falls back to the plain mixed forward (and drops the drafts) when its KV cannot
// be reserved. Returns the logits rows the decode rows took (the first slice's row).
int32_t Scheduler::fused_forward(const std::vector<Live*>& rows,
                                 const std::vector<PrefillSlice>& slices, bool single,
                                 Drafts& drafts) {
  std::vector<PlanRow> chunks;
  for (const auto& s : slices) chunks.push_back(slice_row(s));
  if (!drafts.empty()) {
    std::vector<int32_t> tokens, ks;
    std::vector<Sequence*> seqs;
    for (size_t i = 0; i < rows.size(); ++i) {
      seqs.push_back(&rows[i]->seq);
      tokens.push_back(rows[i]->pending);
      tokens.insert(tokens.end(), drafts[i].begin(), drafts[i].end());
      ks.push_back(static_cast<int32_t>(drafts[i].size()));
    }
    StepPlan plan{ReferenceCall::MixedVerifyBatch, prefill_stream_, verify_rows(tokens, ks, seqs)};
    plan.rows.insert(plan.rows.end(), chunks.begin(), chunks.end());
    try {
      backend_.execute(plan);
      return static_cast<int32_t>(tokens.size());
    } catch (const KvExhausted&) {
      drafts.clear();
    }
  }
  StepPlan plan{
      single ? ReferenceCall::MixedForward : ReferenceCall::MixedForwardBatch, prefill_stream_, {}};
  for (Live* row : rows) plan.rows.push_back(decode_row(row->seq, row->pending));
  plan.rows.insert(plan.rows.end(), chunks.begin(), chunks.end());
  backend_.execute(plan);
  return static_cast<int32_t>(rows.size());
}

void Scheduler::read_fused(const std::vector<Live*>& rows, const Drafts& drafts) {
  if (!drafts.empty()) {
    decode_->fused_accept(*this, rows, drafts);
    return;
  }
  const auto toks = read_back_direct(rows);
  for (size_t i = 0; i < rows.size(); ++i) accept_token(*rows[i], toks[i]);
}

PrefillSlice Scheduler::next_slice(Live& live) {
  PrefillSlice s;
  s.seq = &live.seq;
  s.prompt = &live.req.prompt;
  s.start = live.offset;
  const int32_t total = live.prompt_len();
  s.len = plan_chunk_len(s.start, total, std::min(total - s.start, cfg_.max_prefill_tokens),
                         block_size_);
  s.last = s.start + s.len >= total;
  return s;
}

void Scheduler::announce(const Sequence& seq, int32_t len, int32_t start,
                         const std::vector<int32_t>& toks) {
  if (hooks_ == nullptr) return;
  hooks_->ep_broadcast_cmd_for_seq(static_cast<uint32_t>(seq.slot), kEpPrefillAnnounce);
  hooks_->ep_broadcast_cmd(static_cast<uint32_t>(len));
  hooks_->ep_broadcast_cmd(static_cast<uint32_t>(start));
  hooks_->ep_broadcast_cmd(static_cast<uint32_t>(toks.size()));
  hooks_->ep_broadcast_tokens(toks);
  hooks_->ep_sync_vision_embeds(static_cast<int32_t>(toks.size()));
}

// The decode stream must not read KV the prefill stream is still writing.
void Scheduler::sync_prefill_stream() {
  if (info_.streams) backend_.join_streams(prefill_event_, prefill_stream_, kDecodeStream);
  if (hooks_ == nullptr) return;
  hooks_->record_event(prefill_event_, prefill_stream_);
  hooks_->stream_wait_event(kDecodeStream, prefill_event_);
}

// Greedy first tokens on the chunked paths are a device argmax; the rest go through the host
// sampler. The non-chunked path always samples on the host with the stop tokens masked, so a
// whole-prompt prefill never ends a request on its first token.
SampledToken Scheduler::first_token(Live& live, int32_t row) {
  const bool chunked = cfg_.max_prefill_tokens > 0;
  const bool host = !chunked || !live.req.params.plain_argmax() ||
                    live.req.params.wants_logprobs() || floor_active(live);
  if (!host) {
    SampledToken t;
    t.token = backend_.argmax_on_device(row, kDecodeStream);
    return t;
  }
  if (hooks_ != nullptr) hooks_->copy_logits_to_host(row, 1);
  SampleRow sr;
  sr.request_id = live.req.id;
  sr.row = row;
  sr.seq = &live.seq;
  sr.params = live.req.params;
  sr.n_generated = 0;
  sr.mask_stop = !chunked || floor_active(live);
  sr.stop_tokens = live.stop_tokens;
  return backend_.sample_rows({sr}).at(0);
}

// A first token that is a stop token (or a request of at most one token) finishes at once; it
// still joins `active` so the end of this tick retires it like any other (trace spec 9.4).
void Scheduler::promote(LivePtr live, const SampledToken& tok) {
  live->pending = tok.token;
  live->output.push_back(tok.token);
  const bool stop = is_stop(*live, tok.token);
  if (!stop) emit_token(*live, tok, false);
  live->finished = stop || live->remaining() <= 0 || at_ceiling(*live);
  if (!live->finished) decode_->admit(*live);
  active_.push_back(std::move(live));
}

}  // namespace met
