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
  for (size_t li = 0; li < c.text.layer_types.size(); ++li)  // the whole request's K/V at once
    if (c.text.layer_types[li] == LayerType::FullAttention) {
      st_.k[li].reserve(size_t(L * c.text.kv_heads * c.text.head_dim));
      st_.v[li].reserve(size_t(L * c.text.kv_heads * c.text.head_dim));
    }
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
               [&](int64_t, int64_t n, const float* hidden) { append_head_rows(h_, c_.head, hidden, n, rows_); });
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

std::vector<std::vector<double>> sequence_probs(const TextWeights& w, const HeadWeights& h, const ModelConfig& c, const Sequence& e,
                                                GdnForm form, const SequenceRun& run) {
  SequenceRunner r(w, h, c, e, form, run.from);
  if (run.snapshot) {
    if (run.snapshot_at <= r.position() || run.snapshot_at > r.prefix_limit() || run.snapshot_at % kChunkTokens != 0)
      throw Error(Status::Internal, "internal_error",
                  "sequence_probs: a snapshot at " + std::to_string(run.snapshot_at) + " tokens (prefix limit " + std::to_string(r.prefix_limit()) + ")");
    r.advance(run.snapshot_at);
    *run.snapshot = r.snapshot();
  }
  r.advance(e.length);
  return r.finish();
}

}  // namespace clefrt::model
