#include "cuda/model/qlinear.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "cuda/runtime/check.h"
#include "cuda/ops/kernels_quant.h"

namespace clefrt::cuda {

std::vector<const DevLinear*> LinearRunner::schedule_order(const DevModel& m) {
  std::vector<const DevLinear*> order;
  for (const DevLayer& l : m.layers) {
    if (l.type == model::LayerType::LinearAttention) {
      order.push_back(&l.gdn_in);
      order.push_back(&l.gdn_out);
    } else {
      order.push_back(&l.qkv);
      order.push_back(&l.o);
    }
    order.push_back(&l.gate_up);
    order.push_back(&l.down);
  }
  return order;
}

bool LinearRunner::fused_nvfp4(const DevLinearPart& p) const {
  // (not a part whose codes are in nvfp4_gemm_rs's order: nvfp4_gemm reads the file's)
  return w4a16_ == W4A16Kernel::Fused && p.fmt == WFormat::NVFP4 && !p.scales_swizzled && !p.rs && nvfp4_gemm_supports(p.k, p.k);
}

namespace {
// cuBLASLt's FP8 GEMM wants its output rows 16 bytes apart and 16-byte aligned (bf16: 8 values).
bool fp8_direct(int64_t row0, int64_t ldy, size_t es) { return (size_t(ldy) * es) % 16 == 0 && (size_t(row0) * es) % 16 == 0; }
}  // namespace

// fp32 scratch rows padded to 16 bytes (the FP8 GEMM's output alignment)
int64_t scratch_ld(int64_t n) { return (n + 3) / 4 * 4; }

int64_t LinearRunner::fp8_scratch_cols(const DevModel& m) {
  int64_t cols = scratch_ld(m.c.hidden);
  for (const DevLinear* l : schedule_order(m))
    for (const DevLinearPart& p : l->parts)
      if (p.fmt == WFormat::FP8 && !fp8_direct(p.row0, l->n, 2)) cols = std::max(cols, scratch_ld(p.n));
  return cols;
}

LinearRunner::LinearRunner(const DevModel& m, Gemm& gemm, cudaStream_t s, size_t stage_bytes, W4A16Kernel w4a16,
                           W4A16Gemm w4a16_gemm)
    : m_(m), gemm_(gemm), s_(s), w4a16_(w4a16), w4a16_gemm_(w4a16_gemm), fp8_cols_(fp8_scratch_cols(m)) {
  layer_chunk_.assign(m.layers.size() + 1, 0);
  if (!m.has_nvfp4) return;
  size_t slot = 0;
  const std::vector<const DevLinear*> order = schedule_order(m);
  for (size_t i = 0; i < order.size(); ++i) {
    if (i % kLinearsPerLayer == 0) layer_chunk_[i / kLinearsPerLayer] = chunks_.size();
    for (const DevLinearPart& p : order[i]->parts) {
      // native FP4 parts and fused W4A16 ones need no staging
      if (p.fmt != WFormat::NVFP4 || p.scales_swizzled || fused_nvfp4(p)) continue;
      const int64_t rows_per_chunk = std::max<int64_t>(16, int64_t(stage_bytes / size_t(p.k * 2)));
      // equal chunks (GEMMs of similar shape) rather than full ones and a small remainder
      const int64_t nchunks = (p.n + rows_per_chunk - 1) / rows_per_chunk, rows = (p.n + nchunks - 1) / nchunks;
      for (int64_t r0 = 0; r0 < p.n; r0 += rows) {
        chunks_.push_back({&p, r0, std::min(rows, p.n - r0)});
        slot = std::max(slot, size_t(std::min(rows, p.n - r0) * p.k) * 2);
      }
    }
  }
  layer_chunk_.back() = chunks_.size();
  if (chunks_.empty()) return;  // every NVFP4 part runs natively (Blackwell): no staging
  const bool tables = std::all_of(chunks_.begin(), chunks_.end(), [](const Chunk& c) { return bool(c.part->rs); });
  if (tables && w4a16 == W4A16Kernel::Staged && w4a16_gemm != W4A16Gemm::MmaSync && nvfp4_gemm_rs_available())
    rs_max_tokens_ = env_count("CLEFRT_LAB_W4A16_RS_MAX_M", kRsMaxTokens, 0, int64_t(1) << 30);
  // CLEFRT_LAB_W4A16_RS_STREAM_K=0: a CTA a tile always (the stream-K lab comparison);
  // CLEFRT_LAB_W4A16_RS_TUNE=0: nvfp4_gemm_rs_tile's tile, untimed (the tuning's)
  if (rs_max_tokens_ > 0) {
    if (env_count("CLEFRT_LAB_W4A16_RS_STREAM_K", 1, 0, 1) == 1) rs_work_ = std::make_unique<Nvfp4RsWork>();
    rs_tune_ = std::make_unique<W4A16RsTuner>(s, rs_work_.get(), env_count("CLEFRT_LAB_W4A16_RS_TUNE", 1, 0, 1) == 1);
  }
  slots_[0] = DeviceBuffer(slot, "NVFP4 staging");
  slots_[1] = DeviceBuffer(slot, "NVFP4 staging");
  check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "NVFP4 staging stream");
  for (int i = 0; i < 2; ++i) {
    check(cudaEventCreateWithFlags(&ready_[i], cudaEventDisableTiming), "NVFP4 staging event");
    check(cudaEventCreateWithFlags(&free_[i], cudaEventDisableTiming), "NVFP4 staging event");
  }
}

LinearRunner::~LinearRunner() {
  if (side_) cudaStreamSynchronize(side_);
  for (int i = 0; i < 2; ++i) {
    if (ready_[i]) cudaEventDestroy(ready_[i]);
    if (free_[i]) cudaEventDestroy(free_[i]);
  }
  if (side_) cudaStreamDestroy(side_);
}

void LinearRunner::begin(const QuantScratch& sc, size_t layer, int64_t tokens) {
  if (layer >= layer_chunk_.size()) throw Error(Status::Internal, "internal_error", "NVFP4 staging: begin past the last layer");
  sc_ = sc;
  defer_ = false;  // nothing left over from a forward that threw
  pending_ = {};
  cursor_ = layer_chunk_[layer];
  rs_pass_ = tokens <= rs_max_tokens_;
  if (rs_pass_ || cursor_ >= chunks_.size()) return;
  // Both slots are free once what the main stream has queued so far is done.
  for (int i = 0; i < 2; ++i) check(cudaEventRecord(free_[i], s_), "NVFP4 staging");
  issue(cursor_);
}

void LinearRunner::replay_from(size_t pos) {
  if (pos == cursor_ || rs_pass_) return;
  if (pos > cursor_ || pos >= chunks_.size())
    throw Error(Status::Internal, "internal_error", "NVFP4 staging: replay from a position not yet run");
  // The chunk prefetched last (for what would have come next) is simply overwritten later:
  // the side stream runs in order and each slot's GEMMs release it through free_.
  cursor_ = pos;
  issue(pos);
}

void LinearRunner::issue(size_t i) {
  const Chunk& c = chunks_[i];
  const int slot = int(i & 1);
  check(cudaStreamWaitEvent(side_, free_[slot], 0), "NVFP4 staging");
  const DevLinearPart& p = *c.part;
  (p.rs ? nvfp4_dequantize_rs : nvfp4_dequantize)(p.packed + c.r0 * (p.k / 2), p.scales + c.r0 * (p.k / 16), p.row_gs + c.r0, c.rows, p.k,
                                                  slots_[slot].as<bf16>(), side_);
  check(cudaEventRecord(ready_[slot], side_), "NVFP4 staging");
}

void LinearRunner::run_nvfp4(const bf16* x, int64_t m, int64_t ldx, const DevLinearPart& p, char* y, size_t es, OutType yt, int64_t ldy,
                             bool acc, const char* op) {
  const bf16* xin = x;
  int64_t ldxin = ldx;
  if (p.input_global_scale > 0) {  // W4A4: the activations as W4A4 sees them
    if (!sc_.xq16) throw Error(Status::Internal, "internal_error", std::string(op) + ": W4A4 scratch not planned");
    nvfp4_fake_quantize_rows(x, m, p.k, ldx, p.input_global_scale, sc_.xq16, p.k, s_);
    xin = sc_.xq16;
    ldxin = p.k;
  }
  if (rs_pass_ && p.rs) {  // every staged part has its tables (the constructor)
    rs_tune_->run(xin, m, p.k, ldxin, p.packed, p.scales, p.rs, p.n, y, yt == OutType::F32, ldy, acc, op);
    return;
  }
  if (fused_nvfp4(p)) {
    nvfp4_gemm(xin, m, p.k, ldxin, p.packed, p.scales, p.row_gs, p.n, y, yt == OutType::F32, ldy, acc, s_, w4a16_gemm_);
    return;
  }
  for (int64_t r0 = 0; r0 < p.n;) {
    if (cursor_ >= chunks_.size() || chunks_[cursor_].part != &p || chunks_[cursor_].r0 != r0)
      throw Error(Status::Internal, "internal_error", std::string(op) + ": NVFP4 Linears ran out of their planned order");
    const Chunk& c = chunks_[cursor_];
    const int slot = int(cursor_ & 1);
    if (cursor_ + 1 < chunks_.size()) issue(cursor_ + 1);  // its slot was released after chunk cursor_-1's GEMM
    check(cudaStreamWaitEvent(s_, ready_[slot], 0), "NVFP4 staging");
    gemm_.run(xin, m, p.k, ldxin, slots_[slot].as<bf16>(), c.rows, y + size_t(c.r0) * es, yt, ldy, acc, op);
    check(cudaEventRecord(free_[slot], s_), "NVFP4 staging");
    r0 += c.rows;
    ++cursor_;
  }
}

bool LinearRunner::run_fp8_unscaled(const bf16* x, int64_t m, int64_t ldx, const DevLinear& l, bf16* y, int64_t ldy, const char* op,
                                    Fp8Scales& sc, bool x_quantized) {
  if (l.parts.empty() || l.parts.size() > 2 || !sc_.xq8) return false;
  for (const DevLinearPart& p : l.parts)
    if (p.fmt != WFormat::FP8 || !fp8_direct(p.row0, ldy, 2)) return false;
  // the parts tile the output columns from 0 (what Fp8Scales' split describes)
  if (l.parts[0].row0 != 0 || l.parts.back().row0 + l.parts.back().n != l.n || (l.parts.size() == 2 && l.parts[1].row0 != l.parts[0].n))
    return false;
  if (m == 0) return false;
  Fp8Input in;
  if (x_quantized && !fp8_input(l, in)) return false;
  run_parts(x, m, ldx, l, y, OutType::BF16, ldy, false, op, PartsMode{x_quantized, true});
  sc = Fp8Scales{sc_.xs, l.parts[0].row_scale, l.parts.size() == 2 ? l.parts[1].row_scale : nullptr, l.parts.size() == 2 ? l.parts[1].row0 : l.n};
  return true;
}

bool LinearRunner::run_fp8_first_unscaled(const bf16* x, int64_t m, int64_t ldx, const DevLinear& l, float* y, int64_t ldy, int64_t cols,
                                          const char* op, Fp8Scales& sc, bool x_quantized) {
  if (l.parts.empty() || !sc_.xq8 || m == 0) return false;
  Fp8Input in;
  if (x_quantized && !fp8_shared_input(l, in)) return false;
  const DevLinearPart& p0 = l.parts[0];
  if (p0.fmt != WFormat::FP8 || p0.row0 != 0 || p0.n != cols || !fp8_direct(0, ldy, 4)) return false;
  for (size_t i = 1; i < l.parts.size(); ++i)
    if (l.parts[i].fmt != WFormat::BF16) return false;
  run_parts(x, m, ldx, l, y, OutType::F32, ldy, false, op, PartsMode{x_quantized, true});
  sc = Fp8Scales{sc_.xs, p0.row_scale, nullptr, p0.n};
  return true;
}

bool LinearRunner::fp8_shared_input(const DevLinear& l, Fp8Input& in) const {
  if (!sc_.xq8 || !sc_.xs) return false;
  const DevLinearPart* first = nullptr;
  for (const DevLinearPart& p : l.parts) {
    if (p.fmt != WFormat::FP8) continue;
    if (first && (p.k != first->k || p.kp != first->kp)) return false;
    if (!first) first = &p;
  }
  if (!first) return false;
  in = Fp8Input{sc_.xq8, first->k, first->kp, sc_.xs};
  return true;
}

bool LinearRunner::fp8_input(const DevLinear& l, Fp8Input& in) const {
  if (l.parts.empty() || !sc_.xq8 || !sc_.xs) return false;
  for (const DevLinearPart& p : l.parts)  // the parts share one quantized input (run_parts)
    if (p.fmt != WFormat::FP8 || p.k != l.parts[0].k || p.kp != l.parts[0].kp) return false;
  in = Fp8Input{sc_.xq8, l.parts[0].k, l.parts[0].kp, sc_.xs};
  return true;
}

void LinearRunner::run_fp8_quantized(int64_t m, const DevLinear& l, void* y, OutType yt, int64_t ldy, bool accumulate, const char* op) {
  Fp8Input in;
  if (!fp8_input(l, in)) throw Error(Status::Internal, "internal_error", std::string(op) + ": run_fp8_quantized needs FP8 parts only");
  run_parts(nullptr, m, 0, l, y, yt, ldy, accumulate, op, PartsMode{true, false});
}

void LinearRunner::run(const bf16* x, int64_t m, int64_t ldx, const DevLinear& l, void* y, OutType yt, int64_t ldy, bool accumulate,
                       const char* op) {
  run_parts(x, m, ldx, l, y, yt, ldy, accumulate, op, PartsMode{});
}

void LinearRunner::flush_pending() {
  if (!has_pending()) return;
  const PendingResidual p = pending_;
  pending_ = {};
  scale_rows_cols_acc(p.add.t, p.rows, p.n, p.add.ldt, p.add.rs, p.add.cs, p.y, p.ldy, s_);
}

void LinearRunner::run_parts(const bf16* x, int64_t m, int64_t ldx, const DevLinear& l, void* y, OutType yt, int64_t ldy, bool accumulate,
                             const char* op, PartsMode mode) {
  const bool defer = defer_;
  defer_ = false;  // a request for this run only
  if (has_pending())  // it reads this scratch's acc / xs, which this run may overwrite
    throw Error(Status::Internal, "internal_error", std::string(op) + ": a residual add is pending; the norm after it must take it first");
  if (m == 0) return;
  const size_t es = yt == OutType::F32 ? 4 : 2;
  bool fp8_ready = mode.x_quantized;
  for (const DevLinearPart& p : l.parts) {
    char* yp = static_cast<char*>(y) + size_t(p.row0) * es;
    switch (p.fmt) {
      case WFormat::BF16:
        gemm_.run(x, m, p.k, ldx, p.w, p.n, yp, yt, ldy, accumulate, op);
        break;
      case WFormat::NVFP4:
        if (p.scales_swizzled) {  // Blackwell: the FP4 tensor cores
          if (!sc_.xq4) throw Error(Status::Internal, "internal_error", std::string(op) + ": native FP4 scratch not planned");
          check(cudaMemsetAsync(sc_.xsc, 0, size_t(nvfp4_swizzled_bytes(m, p.k)), s_), op);
          nvfp4_quantize_rows_packed(x, m, p.k, ldx, p.input_global_scale, sc_.xq4, sc_.xsc, s_);
          gemm_.run_fp4(sc_.xq4, sc_.xsc, m, p.k, p.packed, p.scales_swizzled, p.n, 1.0f / (p.input_global_scale * p.part_gs), yp, yt, ldy,
                        accumulate, op);
        } else {
          run_nvfp4(x, m, ldx, p, yp, es, yt, ldy, accumulate, op);
        }
        break;
      case WFormat::FP8:
        if (!sc_.xq8) throw Error(Status::Internal, "internal_error", std::string(op) + ": FP8 scratch not planned");
        if (!fp8_ready) {  // the parts of one Linear share the quantized input
          fp8_quantize_rows(x, m, p.k, ldx, sc_.xq8, p.kp, sc_.xs, s_);
          fp8_ready = true;
        }
        if (accumulate) {
          if (yt != OutType::F32 || scratch_ld(p.n) > fp8_cols_)
            throw Error(Status::Internal, "internal_error", std::string(op) + ": FP8 accumulation is planned for the residual stream only");
          gemm_.run_fp8(sc_.xq8, m, p.kp, p.w8, p.n, sc_.acc, OutType::F32, scratch_ld(p.n), op);
          if (defer && l.parts.size() == 1) {  // the next norm adds it (defer_next_accumulate)
            if (has_pending()) throw Error(Status::Internal, "internal_error", std::string(op) + ": a residual add is already pending");
            pending_ = PendingResidual{ResidualFp8{sc_.acc, scratch_ld(p.n), sc_.xs, p.row_scale}, reinterpret_cast<float*>(yp), m, p.n, ldy};
            break;
          }
          scale_rows_cols_acc(sc_.acc, m, p.n, scratch_ld(p.n), sc_.xs, p.row_scale, reinterpret_cast<float*>(yp), ldy, s_);
        } else if (!fp8_direct(p.row0, ldy, es)) {
          if (scratch_ld(p.n) > fp8_cols_) throw Error(Status::Internal, "internal_error", std::string(op) + ": FP8 scratch too small");
          gemm_.run_fp8(sc_.xq8, m, p.kp, p.w8, p.n, sc_.acc, OutType::F32, scratch_ld(p.n), op);
          scale_rows_cols_store(sc_.acc, m, p.n, scratch_ld(p.n), sc_.xs, p.row_scale, yp, yt == OutType::BF16, ldy, s_);
        } else {
          gemm_.run_fp8(sc_.xq8, m, p.kp, p.w8, p.n, yp, yt, ldy, op);
          if (mode.fp8_unscaled) break;
          if (yt == OutType::F32) scale_rows_cols_f32(reinterpret_cast<float*>(yp), m, p.n, ldy, sc_.xs, p.row_scale, s_);
          else scale_rows_cols_bf16(reinterpret_cast<bf16*>(yp), m, p.n, ldy, sc_.xs, p.row_scale, s_);
        }
        break;
    }
  }
}

}  // namespace clefrt::cuda
