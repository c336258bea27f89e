#include "model/sequence_forward.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "model/head.h"

namespace clefrt::model {

SequenceRunner::SequenceRunner(const TextWeights& w, const HeadWeights& h, const ModelConfig& c, const Sequence& e, GdnForm form,
                               const PrefixState* from)
    : w_(w), h_(h), c_(c), e_(e), form_(form) {
  const int64_t L = e.length, start = from ? from->backbone.length : 0;
  if (L <= 0) throw Error(Status::Internal, "internal_error", "SequenceRunner: an empty sequence");
  limit_ = std::min(e.prefix_limit, L - 1) / kChunkTokens * kChunkTokens;
  if (start > limit_ || start % kChunkTokens != 0)
    throw Error(Status::Internal, "internal_error",
                "SequenceRunner: a prefix of " + std::to_string(start) + " tokens for a sequence whose prefix may cover " + std::to_string(limit_));
  st_ = from ? from->backbone : BackboneState::start(c.text);
  st_.reserve(c.text, L);  // the whole request's K/V at once
  rows_.normed_first = limit_;  // the spans and the last row lie after the prefix_limit
  if (from) {
    rows_.rows = start;
    rows_.memory = from->memory;
  }
}

void SequenceRunner::advance(int64_t until) {
  until = std::min(until, e_.length);
  if (until < st_.length || (until % kChunkTokens != 0 && until != e_.length))
    throw Error(Status::Internal, "internal_error", "SequenceRunner: advance to " + std::to_string(until) + " from " + std::to_string(st_.length));
  backbone_run(w_, c_.text, e_.ids, until, st_, form_,
               [&](int64_t, int64_t n, const float* hidden) { append_head_rows(h_, c_.head, hidden, n, rows_); }, e_.media);
}

PrefixState SequenceRunner::snapshot() const {
  if (st_.length % kChunkTokens != 0 || st_.length > limit_)
    throw Error(Status::Internal, "internal_error", "SequenceRunner: a snapshot at " + std::to_string(st_.length) + " tokens");
  PrefixState p;
  p.backbone = st_;
  p.memory = rows_.memory;
  return p;
}

std::vector<std::vector<double>> SequenceRunner::finish() {
  if (st_.length != e_.length) throw Error(Status::Internal, "internal_error", "SequenceRunner: finish before the last token");
  return joint_head(h_, c_.head, w_.lm_head, rows_, e_);
}

}  // namespace clefrt::model
