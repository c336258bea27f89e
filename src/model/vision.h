// The vision tower (spec/model.md 2) in fp32 over the CPU ops, the oracle the GPU tower will be
// checked against: one image's patches in, its merged tokens (the embeddings that replace its
// <|image_pad|> tokens) out.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace clefrt::model {

// What the image processor hands the tower: the grid in patches (before the merge) and the
// normalised pixels, one row per patch in merge-block order (t, h_block, w_block, h_in, w_in),
// each row C x T x P x P (channel, frame, y, x).
struct ImagePatches {
  int64_t grid_t = 1, grid_h = 0, grid_w = 0;
  std::vector<float> pixels;  // [grid_t * grid_h * grid_w, C * T * P * P]
  // Or, for the GPU tower (pixels empty): the resized image itself, (grid_h * P) x (grid_w * P)
  // x 3 bytes row-major, which the GPU normalises and cuts into the same rows (a quarter of the
  // bf16 pixels' bytes to upload, half of that again for the repeated frame).
  std::vector<uint8_t> rgb;
};

// [grid_t * grid_h * grid_w / merge^2, out_hidden]. Throws a 422 for a grid the tower cannot take
// (sides not multiples of the merge size, or pixels of the wrong size).
std::vector<float> vision_forward(const VisionWeights& w, const VisionConfig& c, const ImagePatches& im);

// Its pieces, for tests: the position table resampled to the grid (bilinear, align_corners,
// as torch.linspace places the sample points), [t * h * w, hidden] in merge-block order; and
// each patch's (row, column) in that order.
// The four table rows and weights each grid point (i, j) of a gh x gw grid samples, row-major;
// the embedding is sum_k table[idx[k]] * wt[k], summed in k order.
struct PositionTaps {
  int64_t idx[4];
  float wt[4];
};
std::vector<PositionTaps> vision_position_taps(const VisionConfig& c, int64_t grid_h, int64_t grid_w);
std::vector<float> vision_position_embeddings(const VisionWeights& w, const VisionConfig& c, int64_t grid_t, int64_t grid_h, int64_t grid_w);
std::vector<std::pair<int64_t, int64_t>> vision_patch_rows_cols(const VisionConfig& c, int64_t grid_t, int64_t grid_h, int64_t grid_w);
// The 2-D rotary's hd / 4 inverse frequencies, 1 / 10000^(2j / (hd / 2)) in fp32 (CPU and GPU).
std::vector<float> vision_rotary_inv_freq(const VisionConfig& c);
// torch.linspace(start, end, steps) in fp32 (the first half counted from start, the rest from end).
std::vector<float> torch_linspace(float start, float end, int64_t steps);

}  // namespace clefrt::model
