#include "model/sequence_forward.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "model/head.h"

namespace clefrt::model {

std::vector<std::vector<double>> sequence_probs(const TextWeights& w, const HeadWeights& h, const ModelConfig& c, const Sequence& e,
                                                GdnForm form, const SequenceRun& run) {
  const int64_t L = e.length, start = run.from ? run.from->backbone.length : 0;
  if (L <= 0) throw Error(Status::Internal, "internal_error", "sequence_probs: an empty sequence");
  const int64_t limit = std::min(e.prefix_limit, L - 1) / kChunkTokens * kChunkTokens;
  if (start > limit || start % kChunkTokens != 0 ||
      (run.snapshot && (run.snapshot_at <= start || run.snapshot_at > limit || run.snapshot_at % kChunkTokens != 0)))
    throw Error(Status::Internal, "internal_error",
                "sequence_probs: a prefix of " + std::to_string(start) + " / snapshot at " + std::to_string(run.snapshot_at) +
                    " tokens for a sequence whose prefix may cover " + std::to_string(limit));
  BackboneState st = run.from ? run.from->backbone : BackboneState::start(c.text);
  HeadRows rows;
  rows.normed_first = limit;  // the spans and the last row lie after the prefix_limit
  if (run.from) {
    rows.rows = start;
    rows.memory = run.from->memory;
  }
  const ChunkSink sink = [&](int64_t, int64_t n, const float* hidden) { append_head_rows(h, c.head, hidden, n, rows); };
  if (run.snapshot) {
    backbone_run(w, c.text, e.ids, run.snapshot_at, st, form, sink);
    run.snapshot->backbone = st;
    run.snapshot->memory = rows.memory;
  }
  backbone_run(w, c.text, e.ids, L, st, form, sink);
  return joint_head(h, c.head, w.lm_head, rows, e);
}

}  // namespace clefrt::model
