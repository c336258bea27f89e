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

// In steps, so a long request can give way to others between them: the backbone advances
// chunk by chunk; the state at a chunk boundary can be taken for the cache. `from`: the state
// after the request's first from->backbone.length ids (null: from the start).
class SequenceRunner {
 public:
  SequenceRunner(const TextWeights& w, const HeadWeights& h, const ModelConfig& c, const Sequence& e, GdnForm form,
                 const PrefixState* from = nullptr);
  int64_t position() const { return st_.length; }
  int64_t length() const { return e_.length; }
  // The most a cached prefix of this request may cover: e.prefix_limit down to a chunk boundary.
  int64_t prefix_limit() const { return limit_; }
  // Runs the backbone on to `until` (a multiple of kChunkTokens, or the length).
  void advance(int64_t until);
  PrefixState snapshot() const;  // the state at position() (a chunk boundary)
  size_t state_bytes() const { return st_.bytes() + rows_.memory.size() * sizeof(float); }  // what snapshot() copies
  // The probabilities, once position() == length().
  std::vector<std::vector<double>> finish();

 private:
  const TextWeights& w_;
  const HeadWeights& h_;
  const ModelConfig& c_;
  const Sequence& e_;
  GdnForm form_;
  int64_t limit_;
  BackboneState st_;
  HeadRows rows_;
};

}  // namespace clefrt::model
