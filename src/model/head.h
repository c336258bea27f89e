// The joint schema head (spec/model.md 4) in fp32 over the CPU ops.
#pragma once
#include <cstdint>
#include <vector>

#include "model/batch.h"
#include "model/config.h"
#include "model/weights.h"

namespace clefrt::model {

// What the head reads of a sequence's rows: the memory M of every row, and Hn (hidden_norm of
// the final-norm hidden state) of the rows from `normed_first` on, where the question and
// option spans and the last row lie; the prefix before it is read through M only.
struct HeadRows {
  int64_t rows = 0;
  std::vector<float> memory;  // M [rows, width]
  int64_t normed_first = 0;
  std::vector<float> normed;  // Hn [rows - normed_first, hidden]
};

// Appends rows [first, first + n) (first == out.rows) given their final-norm hidden states
// [n, hidden]. M is one product per call, so a row's bits depend on how the rows were split:
// the forward calls it once per backbone chunk (model/forward.h kChunkTokens), aligned to the
// sequence start, wherever the sequence came from.
void append_head_rows(const HeadWeights& h, const HeadConfig& c, const float* hidden, int64_t n, HeadRows& out);

// Per-question option probabilities (encoded option order).
std::vector<std::vector<double>> joint_head(const HeadWeights& h, const HeadConfig& c, const Tensor& lm_head, const HeadRows& rows,
                                            const Sequence& e);
// From a whole sequence's hidden states [e.length, hidden] (split as the forward splits them).
std::vector<std::vector<double>> joint_head(const HeadWeights& h, const HeadConfig& c, const Tensor& lm_head, const float* hidden,
                                            const Sequence& e);
inline std::vector<std::vector<double>> joint_head(const HeadWeights& h, const HeadConfig& c, const Tensor& lm_head,
                                                   const float* hidden, const Encoded& e) {
  return joint_head(h, c, lm_head, hidden, sequence_of(e));
}

}  // namespace clefrt::model
