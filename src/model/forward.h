// The Clef computation (spec/model.md 1 and 4) in fp32 over the CPU ops: the Qwen3.5 text
// backbone for several packed sequences (each keeps its own attention and GDN state) and the
// joint schema head for one encoded request.
#pragma once
#include <cstdint>
#include <vector>

#include "model/batch.h"
#include "model/config.h"
#include "model/weights.h"
#include "schema/encode.h"

namespace clefrt::model {

enum class GdnForm { Chunked, Recurrent };

// ids: the sequences one after another; offsets: n+1 starts (offsets[0] = 0, back = ids.size()).
// Returns the final-norm hidden states [ids.size(), hidden].
std::vector<float> backbone_forward(const TextWeights& w, const TextConfig& c, const std::vector<int32_t>& ids,
                                    const std::vector<int64_t>& offsets, GdnForm form = GdnForm::Chunked);

// The same backbone with a finiteness check after every stage: -1 when the token embeddings hold
// a non-finite value, i when the residual stream first does after layer i, the number of layers
// when only the final norm does, -2 when everything stays finite. The engine's error path.
int64_t first_non_finite_layer(const TextWeights& w, const TextConfig& c, const std::vector<int32_t>& ids,
                               const std::vector<int64_t>& offsets);

// Tests of the GPU engine: the same backbone, with values rounded to bf16 wherever the CUDA
// forward stores them in bf16 (GEMM inputs, the attention q/k/v and the MLP activations), so a
// difference from the GPU measures its kernels rather than bf16 itself. (The flash kernel's
// bf16 probabilities are not emulated.)
std::vector<float> backbone_forward_bf16_points(const TextWeights& w, const TextConfig& c, const std::vector<int32_t>& ids,
                                                const std::vector<int64_t>& offsets);

// Calibration (`clefrt quantize`): while set on this thread, every backbone Linear reports its
// input activations [rows, cols] before the product. Null to stop.
using ActivationObserver = void (*)(void* ctx, const Tensor& w, const float* x, int64_t rows, int64_t cols);
void set_activation_observer(ActivationObserver fn, void* ctx);

// Per-question option probabilities (encoded option order) from one request's hidden states.
std::vector<std::vector<double>> joint_head(const HeadWeights& h, const HeadConfig& c, const Tensor& lm_head,
                                            const float* hidden, const Sequence& e);
inline std::vector<std::vector<double>> joint_head(const HeadWeights& h, const HeadConfig& c, const Tensor& lm_head,
                                                   const float* hidden, const Encoded& e) {
  return joint_head(h, c, lm_head, hidden, sequence_of(e));
}

}  // namespace clefrt::model
