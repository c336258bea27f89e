// The Clef computation (spec/model.md 1) in fp32 over the CPU ops: the Qwen3.5 text backbone,
// one sequence at a time in chunks of kChunkTokens that carry a BackboneState
// (model/prefix_state.h) from one to the next. Every sequence is cut at the same places (the
// multiples of kChunkTokens), whether it runs whole, continues a cached prefix or sits in a
// batch, so OpenBLAS (whose kernels and blocking depend on the number of rows) rounds each row
// the same way in all three. The joint head is model/head.h.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/batch.h"
#include "model/config.h"
#include "model/head.h"
#include "model/prefix_state.h"
#include "model/weights.h"
#include "schema/encode.h"

namespace clefrt::model {

enum class GdnForm { Chunked, Recurrent };

// The CPU backbone's chunk: a multiple of the GDN chunk (64) and of the attention kernel's query
// block (cpu::kAttentionBlock), so a sequence continued at a chunk boundary keeps both kernels'
// blocks. A cached prefix is reused in multiples of it.
constexpr int64_t kChunkTokens = 256;

// What a sequence with images adds to its ids (spec/model.md 1.2, 2): each token's three mRoPE
// position rows, and the vision tower's rows that replace its images' <|image_pad|> embeddings.
struct ImagePatches;  // model/vision.h
struct SequenceMedia {
  std::vector<int64_t> pos_t, pos_h, pos_w;  // [length] each
  struct Image {
    int64_t first = 0, count = 0;  // the pad tokens [first, first + count)
    // Not owned. The CPU engine runs the tower in prepare() and hands its rows [count, hidden];
    // the GPU engine hands the processor's patches, which its forward runs through its tower
    // with the batch's other images.
    const float* rows = nullptr;
    const ImagePatches* patches = nullptr;
  };
  std::vector<Image> images;
  // The sequence's ids with each image's first pad tokens replaced by words of its bytes' sha256
  // (negative: never a token id): what the prefix cache matches, so a cached state after an image
  // serves only the same image. Empty: match the ids.
  std::vector<int32_t> key_ids;
};
// The position rows of a sequence of `length` tokens whose images' pad tokens are given (each
// with its merged grid, rows x cols = count): text tokens count on by one on all three rows; an
// image starting at p has t = p, h = p + row, w = p + col, and the text after it goes on from
// p + max(rows, cols). A span with `embeddings` (the tower's [rows * cols, hidden] rows) or
// `patches` (the tower's input) also becomes one of the media's images; with neither, it places
// positions only.
struct MediaSpan {
  int64_t first = 0, rows = 0, cols = 0;
  const float* embeddings = nullptr;
  const ImagePatches* patches = nullptr;
};
SequenceMedia mrope_positions(int64_t length, const std::vector<MediaSpan>& images);

// Receives a chunk's final-norm hidden states: rows [first, first + n) of the sequence, [n, hidden].
using ChunkSink = std::function<void(int64_t first, int64_t n, const float* hidden)>;

// Runs rows [st.length, end) of one sequence (ids: the sequence's ids from its start) through the
// backbone from state `st` (st.length a multiple of kChunkTokens), which it carries on.
// `media`: null for a text-only sequence (positions = token index).
void backbone_run(const TextWeights& w, const TextConfig& c, const int32_t* ids, int64_t end, BackboneState& st, GdnForm form,
                  const ChunkSink& sink, const SequenceMedia* media = nullptr);

// ids: the sequences one after another; offsets: n+1 starts (offsets[0] = 0, back = ids.size()).
// Returns the final-norm hidden states [ids.size(), hidden].
std::vector<float> backbone_forward(const TextWeights& w, const TextConfig& c, const std::vector<int32_t>& ids,
                                    const std::vector<int64_t>& offsets, GdnForm form = GdnForm::Chunked);

// The same backbone with a finiteness check after every stage: -1 when the token embeddings hold
// a non-finite value, i when the residual stream first does after layer i, the number of layers
// when only the final norm does, -2 when everything stays finite. The engine's error path.
// `media`: one sequence's images (their rows join the embeddings, as in the forward).
int64_t first_non_finite_layer(const TextWeights& w, const TextConfig& c, const std::vector<int32_t>& ids,
                               const std::vector<int64_t>& offsets, const SequenceMedia* media = nullptr);

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

}  // namespace clefrt::model
