// One request on the CPU: the backbone in chunks (model/forward.h), the joint head's rows as each
// chunk ends, then the joint head; optionally continuing from a cached prefix and leaving the
// state at a boundary for the cache. A request continued from a prefix state gets the bits it
// gets run whole: both cut it at the same chunk boundaries.
#pragma once
#include <cstdint>
#include <vector>

#include "model/batch.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/prefix_state.h"
#include "model/weights.h"

namespace clefrt::model {

struct SequenceRun {
  const PrefixState* from = nullptr;  // the state after the request's first from->length ids (null: from the start)
  int64_t snapshot_at = 0;            // > 0: write the state after this many tokens (a multiple of kChunkTokens,
  PrefixState* snapshot = nullptr;    // after `from`, at most e.prefix_limit) to *snapshot
};

// Per question, per option (encoded order), the probability.
std::vector<std::vector<double>> sequence_probs(const TextWeights& w, const HeadWeights& h, const ModelConfig& c, const Sequence& e,
                                                GdnForm form, const SequenceRun& run = {});

}  // namespace clefrt::model
