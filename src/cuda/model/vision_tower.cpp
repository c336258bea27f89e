#include "cuda/model/vision_tower.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "cuda/ops/kernels.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/cudnn_attention.h"
#include "io/safetensors_write.h"

namespace clefrt::cuda {

namespace {

// Patches per GEMM block: the qkv / fc1 outputs are planned for a block, not for all patches
// (a 16 MP image has 65,536). A multiple of the merge block.
constexpr int64_t kRowBlock = 4096;

int64_t per_patch(const model::VisionConfig& c) { return c.in_channels * c.temporal_patch * c.patch * c.patch; }
int64_t tiles_bound(const model::VisionConfig& c, int64_t S) {
  const int64_t m2 = c.spatial_merge * c.spatial_merge;  // a frame holds at least one merge block
  return S / flash_attention_full_tile() + S / std::max<int64_t>(m2, 1) + 1;
}
// cuDNN's plan bound on the frames of S patches (at most one a merge block)
int64_t frames_bound(const model::VisionConfig& c, int64_t S) {
  return cudnn_bound(S / std::max<int64_t>(c.spatial_merge * c.spatial_merge, 1) + 1, 1);
}

}  // namespace

VisionScratch VisionScratch::carve(Arena& a, const model::VisionConfig& c, int64_t S) {
  VisionScratch s;
  s.S = S;
  const int64_t H = c.hidden, hd = H / c.heads, Dp = flash_attention_full_padded(hd), B = std::min(S, kRowBlock);
  const int64_t m2 = c.spatial_merge * c.spatial_merge;
  // + cuDNN's ragged arrays for up to one frame per merge block (cudnn_attention.h)
  s.meta = a.carve<int32_t>(S * 6 + 3 * tiles_bound(c, S) + int64_t(ragged_ints(frames_bound(c, S))) + 4, "vision index arrays");
  s.wt = a.carve<float>(S * 4, "vision position weights");
  s.x = a.carve<float>(S * H, "vision residual");
  // the resized images and the pixel blocks live only through patch_embed, before the first
  // block writes q or a GEMM output: they share q's and big's space
  const int64_t rgb_bytes = S * c.patch * c.patch * 3, pix = B * per_patch(c), head_rows = S * c.heads * Dp;
  // q, k, v one after another; or (tower_attention's fused layout) the qkv GEMM's [S, 3 hidden]
  // rows, which 3 heads * Dp >= 3 hidden holds
  s.q = a.carve<bf16>(std::max(3 * head_rows, (rgb_bytes + 1) / 2), "vision q, k, v (first the resized images)");
  s.rgb = reinterpret_cast<uint8_t*>(s.q);
  s.k = s.q + head_rows;
  s.v = s.k + head_rows;
  s.big = a.carve<float>(std::max(B * std::max({3 * H, c.ffn, m2 * H}), (pix + 1) / 2), "vision GEMM out (first the pixels; bf16 qkv, bf16 GELU)");
  s.pix = reinterpret_cast<bf16*>(s.big);
  s.mid = a.carve<bf16>(B * std::max(c.ffn, H), "vision LayerNorm out / merger GELU out");
  return s;
}

std::unique_ptr<CudnnFrameAttention> tower_attention(const model::VisionConfig& c) {
  const int64_t hd = c.hidden / c.heads;
  // Where cuDNN takes the head dims as they are (a multiple of 8): q | k | v straight from the qkv
  // GEMM's rows (3 hidden apart, rotated in place), the output over q, which proj reads as it
  // stands: no copies of v, no pass to pack heads. Else padded heads in q, k, v of their own.
  if (hd % 8 == 0) return std::make_unique<CudnnFrameAttention>(c.heads, hd, hd, 3 * c.hidden);
  return std::make_unique<CudnnFrameAttention>(c.heads, hd, flash_attention_full_padded(hd));
}

void vision_tower(const DevVision& v, Gemm& gemm, const std::vector<const model::ImagePatches*>& images, const VisionScratch& s,
                  float* out, cudaStream_t st, const std::function<void(const char*)>& mark, CudnnFrameAttention* frames_attn) {
  const model::VisionConfig& c = v.c;
  const int64_t H = c.hidden, heads = c.heads, hd = H / heads, m = c.spatial_merge;
  // q / k / v heads dp apart: cuDNN's layout (tower_attention), else clefrt's kernel's padding
  const int64_t Dp = frames_attn ? frames_attn->dp() : flash_attention_full_padded(hd);
  if (Dp < hd || Dp > flash_attention_full_padded(hd))  // the scratch holds heads of the padded width
    throw Error(Status::Internal, "internal_error",
                "vision tower: cuDNN's heads " + std::to_string(Dp) + " apart for head dims " + std::to_string(hd) + " (tower_attention's layout)");
  // tower_attention's fused layout: the qkv GEMM writes its rows into s.q (3 H apart), rope turns
  // q and k there, attention reads q | k | v from them and writes over q
  const bool fused = frames_attn && frames_attn->ld() == 3 * H;
  if (fused && Dp != hd)  // the qkv GEMM's rows hold the heads packed
    throw Error(Status::Internal, "internal_error",
                "vision tower: the fused q | k | v layout needs packed heads (" + std::to_string(Dp) + " apart for head dims " + std::to_string(hd) + ")");
  if (frames_attn && !fused && frames_attn->ld() != heads * Dp)
    throw Error(Status::Internal, "internal_error", "vision tower: cuDNN's rows " + std::to_string(frames_attn->ld()) + " apart (tower_attention's layout)");
  const int64_t m2 = m * m, P = per_patch(c), OH = c.out_hidden;
  int64_t S = 0;
  for (const model::ImagePatches* im : images) {
    const bool rgb_ok = im->pixels.empty() && im->grid_t == 1 && int64_t(im->rgb.size()) == im->grid_h * im->grid_w * c.patch * c.patch * 3;
    if (im->grid_h <= 0 || im->grid_w <= 0 || im->grid_t <= 0 || im->grid_h % m || im->grid_w % m ||
        (!rgb_ok && int64_t(im->pixels.size()) != im->grid_t * im->grid_h * im->grid_w * P))
      throw Error(Status::Unprocessable, "invalid_image",
                  "an image of " + std::to_string(im->grid_t) + " x " + std::to_string(im->grid_h) + " x " + std::to_string(im->grid_w) +
                      " patches (" + std::to_string(im->pixels.size()) + " values) that the vision tower cannot take");
    S += im->grid_t * im->grid_h * im->grid_w;
  }
  if (S == 0) return;
  if (S > s.S)
    throw Error(Status::Internal, "internal_error",
                "the batch's images hold " + std::to_string(S) + " patches; the vision scratch is planned for " + std::to_string(s.S));

  // the host's part in the per-op profile as two ops of its own (the GPU waits on both): the index
  // arrays below, then their uploads and the images'
  mark("vision prep");
  // ---- host index arrays: position taps, rows / columns, attention tiles (one set per frame) ----
  std::vector<int32_t> meta(size_t(S * 6));
  std::vector<float> wt(size_t(S * 4));
  std::vector<int32_t> tq, ts, te;
  std::vector<RaggedSeq> frames;  // cuDNN's ragged sequences: one per frame under kDenseFrame patches
  std::vector<std::pair<int64_t, int64_t>> dense;  // the larger frames (first row, patches): a launch each
  int64_t longest = 0;
  // pixels: a resized image (rgb) goes up as it is and is cut into rows on the GPU; given pixels
  // (tests) are rounded to bf16 here, as the reference runs patch_embed in the tower's dtype
  struct Source {
    int64_t s0, rows;
    const model::ImagePatches* im;
    size_t rgb_at;  // byte offset in s.rgb
  };
  std::vector<Source> sources;
  std::vector<std::pair<const model::ImagePatches*, size_t>> rgb_up;  // (image, byte offset in s.rgb), uploaded after the arrays
  std::vector<uint16_t> pix;
  size_t rgb_bytes = 0;
  int64_t s0 = 0;
  for (const model::ImagePatches* im : images) {
    const auto taps = model::vision_position_taps(c, im->grid_h, im->grid_w);
    const auto rc = model::vision_patch_rows_cols(c, im->grid_t, im->grid_h, im->grid_w);
    for (size_t i = 0; i < rc.size(); ++i) {
      const model::PositionTaps& t = taps[size_t(rc[i].first * im->grid_w + rc[i].second)];
      const int64_t p = s0 + int64_t(i);
      for (int k = 0; k < 4; ++k) {
        meta[size_t(4 * p + k)] = int32_t(t.idx[k]);
        wt[size_t(4 * p + k)] = t.wt[k];
      }
      meta[size_t(4 * S + p)] = int32_t(rc[i].first);
      meta[size_t(5 * S + p)] = int32_t(rc[i].second);
    }
    const int64_t frame = im->grid_h * im->grid_w;
    for (int64_t f0 = s0; f0 < s0 + int64_t(rc.size()); f0 += frame) {
      if (CudnnFrameAttention::dense(frame)) {
        dense.push_back({f0, frame});
      } else {
        frames.push_back({f0, frame, f0, frame});
        longest = std::max(longest, frame);
      }
      for (int64_t q0 = f0; q0 < f0 + frame; q0 += flash_attention_full_tile()) {
        tq.push_back(int32_t(q0));
        ts.push_back(int32_t(f0));
        te.push_back(int32_t(f0 + frame));
      }
    }
    sources.push_back({s0, int64_t(rc.size()), im, rgb_bytes});
    if (im->pixels.empty()) {
      rgb_up.push_back({im, rgb_bytes});
      rgb_bytes += im->rgb.size();
    } else {
      if (pix.empty()) pix.resize(size_t(S * P));
      for (size_t i = 0; i < im->pixels.size(); ++i) pix[size_t(s0 * P) + i] = io::f32_to_bf16(im->pixels[i]);
    }
    s0 += int64_t(rc.size());
  }
  if (int64_t(tq.size()) > tiles_bound(c, S)) throw Error(Status::Internal, "internal_error", "vision attention tiles exceed their plan");
  meta.insert(meta.end(), tq.begin(), tq.end());
  meta.insert(meta.end(), ts.begin(), ts.end());
  meta.insert(meta.end(), te.begin(), te.end());
  const int64_t ntiles = int64_t(tq.size());
  const int64_t nframes = int64_t(frames.size()), fb = cudnn_bound(nframes, 1);
  size_t ragged_at_int = 0;
  if (frames_attn) {
    if (fb > frames_bound(c, S)) throw Error(Status::Internal, "internal_error", "vision attention: more frames than the scratch plans for");
    const int64_t ld = frames_attn->ld();
    ragged_at_int = append_ragged(meta, frames, fb, ld, ld, ld, ld);  // s.meta is 256-byte aligned: the arrays stay 16-byte aligned
  }
  mark("vision upload");
  for (const auto& [im, at] : rgb_up) check(cudaMemcpyAsync(s.rgb + at, im->rgb.data(), im->rgb.size(), cudaMemcpyHostToDevice, st), "upload image");
  check(cudaMemcpyAsync(s.meta, meta.data(), meta.size() * 4, cudaMemcpyHostToDevice, st), "upload vision index arrays");
  check(cudaMemcpyAsync(s.wt, wt.data(), wt.size() * 4, cudaMemcpyHostToDevice, st), "upload vision position weights");
  const int32_t *row = s.meta + 4 * S, *col = s.meta + 5 * S;
  const int32_t* tiles_at = s.meta + 6 * S;
  const AttnTiles tiles{tiles_at, tiles_at + ntiles, tiles_at + 2 * ntiles, ntiles};

  mark("vision patch_embed");
  // a row block of pixels at a time: each upload is stream-ordered after the GEMM that read the
  // previous block
  for (int64_t r0 = 0; r0 < S; r0 += kRowBlock) {
    const int64_t n = std::min(kRowBlock, S - r0);
    for (const Source& src : sources) {
      const int64_t a = std::max(r0, src.s0), b = std::min(r0 + n, src.s0 + src.rows);
      if (a >= b) continue;
      if (src.im->pixels.empty())
        vision_patchify(s.rgb + src.rgb_at, src.im->grid_w * c.patch, src.im->grid_w, m, c.patch, c.temporal_patch, a - src.s0, b - a,
                        s.pix + (a - r0) * P, st);
      else
        check(cudaMemcpyAsync(s.pix + (a - r0) * P, pix.data() + a * P, size_t((b - a) * P) * 2, cudaMemcpyHostToDevice, st),
              "upload image pixels");
    }
    gemm.run(s.pix, n, P, P, v.patch, H, s.x + r0 * H, OutType::F32, H, false, "vision patch_embed");
  }
  vision_embed_finish(s.x, S, H, v.patch_b, v.pos_table, s.meta, s.wt, st);
  // x leaves out the biases of proj and fc2, whose GEMMs accumulate into it: each LayerNorm reads
  // x + their sum so far (DevVision::bias_before) and never writes x back
  if (v.bias_before.size() != 2 * v.blocks.size() + 1)
    throw Error(Status::Internal, "internal_error", "vision tower: the bias sums do not match the blocks");
  for (size_t l = 0; l < v.blocks.size(); ++l) {
    const DevVisionBlock& b = v.blocks[l];
    for (int64_t r0 = 0; r0 < S; r0 += kRowBlock) {
      const int64_t n = std::min(kRowBlock, S - r0);
      mark("vision norm");
      layer_norm_biased(s.x + r0 * H, n, H, H, v.bias_before[2 * l], b.norm1.w, b.norm1.b, 1e-6f, s.mid, nullptr, st);
      // qkv + bias in bf16 (cuBLASLt's epilogue), as the reference's bf16 Linear rounds it
      mark("vision qkv");
      bf16* qkv = fused ? s.q + r0 * 3 * H : reinterpret_cast<bf16*>(s.big);
      gemm.run_epilogue(s.mid, n, H, H, b.qkv, 3 * H, Epilogue::Bias, b.qkv_b, qkv, 3 * H, "vision qkv");
      mark("vision rope");
      if (fused) vision_qkv_rope_inplace(qkv, n, r0, row, col, v.inv_freq, heads, hd, st);
      else vision_qkv_rope(qkv, n, r0, row, col, v.inv_freq, heads, hd, Dp, s.q, s.k, s.v, st);
    }
    mark("vision attention");
    bf16 *q = s.q, *k = fused ? s.q + H : s.k, *vv = fused ? s.q + 2 * H : s.v;
    if (frames_attn) {
      frames_attn->run(q, k, vv, ragged_at(s.meta + ragged_at_int, fb), nframes, longest, st);
      const int64_t ld = frames_attn->ld();
      for (const auto& [f0, n] : dense) frames_attn->run_dense(q + f0 * ld, k + f0 * ld, vv + f0 * ld, n, st);
    } else
      flash_attention_full(s.q, s.k, s.v, heads, hd, tiles, s.q, st);
    // proj reads [S, hidden]: the output over q as it stands when the heads are packed (rows 3 H
    // apart in the fused layout), else the heads' first hd dims side by side
    const bf16* attn_out = s.q;
    int64_t ld_out = fused ? 3 * H : H;
    if (Dp != hd) {
      mark("vision pack heads");
      vision_pack_heads(s.q, S * heads, hd, Dp, s.k, st);
      attn_out = s.k;
      ld_out = H;
    }
    mark("vision proj");
    gemm.run(attn_out, S, H, ld_out, b.proj, H, s.x, OutType::F32, H, true, "vision proj");
    for (int64_t r0 = 0; r0 < S; r0 += kRowBlock) {
      const int64_t n = std::min(kRowBlock, S - r0);
      mark("vision norm");
      layer_norm_biased(s.x + r0 * H, n, H, H, v.bias_before[2 * l + 1], b.norm2.w, b.norm2.b, 1e-6f, s.mid, nullptr, st);
      // fc1 + bias, then GELU (tanh form), in cuBLASLt's epilogue: one rounding to bf16
      mark("vision fc1");
      bf16* act = reinterpret_cast<bf16*>(s.big);
      gemm.run_epilogue(s.mid, n, H, H, b.fc1, c.ffn, Epilogue::BiasGelu, b.fc1_b, act, c.ffn, "vision fc1");
      mark("vision fc2");
      gemm.run(act, n, c.ffn, c.ffn, b.fc2, H, s.x + r0 * H, OutType::F32, H, true, "vision fc2");
    }
  }
  // merger: LayerNorm per patch, each merge block's m^2 rows side by side (consecutive in
  // merge-block order), fc1, exact GELU, fc2
  mark("vision merger");
  layer_norm_biased(s.x, S, H, H, v.bias_before.back(), v.merger_norm.w, v.merger_norm.b, 1e-6f, s.q, nullptr, st);
  const int64_t T = S / m2, TB = kRowBlock / m2, W = m2 * H;
  for (int64_t t0 = 0; t0 < T; t0 += TB) {
    const int64_t n = std::min(TB, T - t0);
    gemm.run(s.q + t0 * W, n, W, W, v.merger_fc1, W, s.big, OutType::F32, W, false, "vision merger fc1");
    bias_gelu_bf16(s.big, n, W, v.merger_fc1_b, s.mid, st);
    gemm.run(s.mid, n, W, W, v.merger_fc2, OH, out + t0 * OH, OutType::F32, OH, false, "vision merger fc2");
    bias_act(out + t0 * OH, n, OH, OH, v.merger_fc2_b, false, st);
  }
}

}  // namespace clefrt::cuda
