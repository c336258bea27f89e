// The vision tower on the GPU (spec/model.md 2), the bf16 twin of model/vision.cpp: the images of
// one packed batch go through it together (every GEMM over all their patches, in row blocks;
// attention bidirectional within each image's frames), so a batch's images cost one pass. Each
// patch's result does not depend on the other images of its batch: the GEMMs are
// batch-invariant and attention never crosses a frame.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "cuda/model/device_model.h"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/cudnn_attention.h"
#include "cuda/runtime/gemm.h"
#include "model/vision.h"

namespace clefrt::cuda {

// The tower's scratch for up to S patches, carved from the forward's arena (it is dead before the
// backbone starts, so it shares the backbone's region).
struct VisionScratch {
  int64_t S = 0;
  bf16* pix = nullptr;            // a row block of the processor's pixels [block, C * T * P * P] (in big)
  uint8_t* rgb = nullptr;         // the resized images, one after another (ImagePatches::rgb; in q)
  float* x = nullptr;             // [S, hidden] the residual stream
  // [S, heads, Dp] (room for clefrt's kernel's zero-padded head dims; cuDNN's heads packed);
  // attention writes over q, which proj reads as it stands when the heads are packed, else k
  // holds its packed [S, hidden] copy; q then the merger's LayerNorm out: no hidden-wide buffer
  // of its own
  bf16 *q = nullptr, *k = nullptr, *v = nullptr;
  float* big = nullptr;           // a row block's qkv / fc1 GEMM output (fp32)
  bf16* mid = nullptr;            // a row block's LayerNorm out, then its GELU output
  int32_t* meta = nullptr;        // per patch: 4 position taps, row, column; then attention tiles
  float* wt = nullptr;            // per patch: the 4 taps' weights
  static VisionScratch carve(Arena& a, const model::VisionConfig& c, int64_t S);
};

// cuDNN's attention for this tower's frames, in the layout vision_tower hands it (heads of hidden /
// heads dims, packed where that is a multiple of 8, else padded to flash_attention_full_padded);
// throws as CudnnFrameAttention's constructor.
std::unique_ptr<CudnnFrameAttention> tower_attention(const model::VisionConfig& c);

// Runs `images` (in order) through the tower and writes their merged rows one image after
// another: [sum of tokens, out_hidden] fp32 at `out`. `mark` names the op that starts (profiling).
// The attention runs on cuDNN's fused kernel when `frames_attn` is given, else on clefrt's.
void vision_tower(const DevVision& v, Gemm& gemm, const std::vector<const model::ImagePatches*>& images, const VisionScratch& s,
                  float* out, cudaStream_t st, const std::function<void(const char*)>& mark, CudnnFrameAttention* frames_attn = nullptr);

}  // namespace clefrt::cuda
