#include "met/step_plan.h"

#include <cstddef>
#include <utility>

namespace met {

PlanRow prefill_row(Sequence& seq, const std::vector<int32_t>& prompt, int32_t start, int32_t len,
                    bool last) {
  PlanRow row;
  row.seq = &seq;
  row.kind = RowKind::PrefillChunk;
  row.start = start;
  row.tokens.assign(prompt.begin() + start, prompt.begin() + start + len);
  row.last_chunk = last;
  row.prompt = &prompt;
  return row;
}

PlanRow slice_row(const PrefillSlice& slice) {
  return prefill_row(*slice.seq, *slice.prompt, slice.start, slice.len, slice.last);
}

PlanRow decode_row(Sequence& seq, int32_t token) {
  PlanRow row;
  row.seq = &seq;
  row.kind = RowKind::Decode;
  row.start = seq.seq_len;
  row.tokens = {token};
  return row;
}

std::vector<PlanRow> verify_rows(const std::vector<int32_t>& tokens, const std::vector<int32_t>& ks,
                                 const std::vector<Sequence*>& seqs) {
  std::vector<PlanRow> rows;
  size_t off = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    PlanRow row;
    row.seq = seqs[i];
    row.kind = RowKind::Verify;
    row.start = seqs[i]->seq_len;
    const auto n = static_cast<size_t>(1 + ks[i]);
    row.tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(off),
                      tokens.begin() + static_cast<std::ptrdiff_t>(off + n));
    row.draft = ks[i];
    rows.push_back(std::move(row));
    off += n;
  }
  return rows;
}

}  // namespace met
