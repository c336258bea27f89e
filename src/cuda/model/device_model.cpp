#include "cuda/model/device_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

#include "common/error.h"
#include "cuda/runtime/check.h"
#include "cuda/ops/kernels.h"
#include "cuda/ops/kernels_quant.h"
#include "io/safetensors_write.h"
#include "model/vision.h"
#include "quant/recipe.h"

namespace clefrt::cuda {

namespace {


// Where a Linear part's values come from.
enum class Source { Plain, Random, Nvfp4, Fp8 };
Source source_of(const model::Tensor& t) {
  if (t.quant == model::Tensor::Quant::Nvfp4 && t.src) return Source::Nvfp4;
  if (t.quant == model::Tensor::Quant::Fp8 && t.src) return Source::Fp8;
  return (t.src || !t.v.empty()) ? Source::Plain : Source::Random;
}

class Builder {
 public:
  Builder(DevModel& m, const BuildOptions& o, bool folder_quantized, bool native_fp4)
      : m_(m), o_(o), folder_quantized_(folder_quantized), native_fp4_(native_fp4) {}

  // Rows of several tensors stacked into one Linear. `keep_bf16[i]`: the recipe keeps part i in
  // bf16 (the GDN's in_proj_b / in_proj_a). Consecutive parts of the same target format share
  // one DevLinearPart (one GEMM).
  DevLinear linear(std::vector<const model::Tensor*> parts, std::vector<bool> keep_bf16 = {}) {
    keep_bf16.resize(parts.size(), false);
    DevLinear l;
    l.k = parts[0]->shape.back();
    for (auto* t : parts) l.n += t->numel_rows();
    size_t i = 0;
    int64_t row0 = 0;
    while (i < parts.size()) {
      const WFormat f = target(*parts[i], !keep_bf16[i]);
      const float igs = input_scale(*parts[i], f);
      size_t j = i + 1;
      while (j < parts.size() && target(*parts[j], !keep_bf16[j]) == f && input_scale(*parts[j], f) == igs) ++j;
      std::vector<const model::Tensor*> group(parts.begin() + long(i), parts.begin() + long(j));
      DevLinearPart p = make_part(group, f, igs);
      p.row0 = row0;
      row0 += p.n;
      m_.bytes_by_format[size_t(f) % 3] += part_bytes(p);
      if (f == WFormat::NVFP4) m_.has_nvfp4 = true;
      if (f == WFormat::NVFP4 && igs > 0) m_.has_w4a4 = true;
      if (f == WFormat::FP8) m_.has_fp8 = true;
      if (f != WFormat::BF16) m_.max_k = std::max(m_.max_k, (l.k + 15) / 16 * 16);
      l.parts.push_back(p);
      i = j;
    }
    return l;
  }
  DevLinear32 matrix32(const model::Tensor& t) {
    const int64_t cols = t.shape.back(), rows = t.numel_rows();
    return {vec(t, 0.0f, 1.0f / std::sqrt(float(cols))), nullptr, rows, cols};
  }
  // The TF32 hi / lo planes of rows [row0, row0 + rows) of an fp32 matrix (f32_gemm_3xtf32_wgmma's
  // B operand), where that kernel runs and neither BuildOptions::head_tf32_planes nor
  // CLEFRT_LAB_F32_GEMM_MMA keeps the mma.sync form; {null, null} otherwise.
  std::pair<const float*, const float*> tf32_planes(const DevLinear32& l, int64_t row0, int64_t rows) {
    static const bool mma = env_flag("CLEFRT_LAB_F32_GEMM_MMA");
    if (!l.w || !o_.head_tf32_planes || mma || !f32_gemm_3xtf32_wgmma_available()) return {nullptr, nullptr};
    const size_t count = size_t(rows) * size_t(l.k);
    float* hi = alloc<float>(count);
    float* lo = alloc<float>(count);
    f32_split_tf32_planes(l.w + row0 * l.k, int64_t(count), hi, lo, nullptr);
    return {hi, lo};
  }
  // A head matrix only head_gemm reads: bf16 when that holds its values exactly, else fp32.
  DevLinear32 matrix_head(const model::Tensor& t) {
    const int64_t cols = t.shape.back(), rows = t.numel_rows();
    const bool exact = !has_data(t) || (t.src && t.src->dtype == io::DType::BF16);
    if (!exact) return matrix32(t);
    bf16* p = alloc<bf16>(size_t(t.numel()));
    put_bf16(t, p, t.numel(), 1.0f / std::sqrt(float(cols)), 0.0f);
    return {nullptr, p, rows, cols};
  }
  // A matrix that stays bf16 whatever o_.quant says (the vision tower).
  const bf16* matrix_bf16(const model::Tensor& t) {
    if (t.quant != model::Tensor::Quant::None)
      throw load_error(t.name, "the vision tower's weights must be bf16, f16 or f32 (a quantized tower is not supported)");
    const int64_t rows = t.shape.front(), cols = t.numel() / std::max<int64_t>(rows, 1);
    bf16* p = alloc<bf16>(size_t(t.numel()));
    put_bf16(t, p, t.numel(), 1.0f / std::sqrt(float(cols)), 0.0f);
    return p;
  }
  // An embedding table, in GPU memory or (offload) in mapped host memory.
  const bf16* table(const model::Tensor& t, float std) {
    const size_t bytes = size_t(t.numel()) * 2;
    if (!o_.offload_embeddings) {
      bf16* p = alloc<bf16>(size_t(t.numel()));
      put_bf16(t, p, t.numel(), std, 0.0f);
      return p;
    }
    HostBuffer hb(bytes, "offloaded embeddings");
    if (t.src && t.src->dtype == io::DType::BF16) {
      std::memcpy(hb.host(), t.src->data, bytes);
    } else {
      DeviceBuffer tmp(bytes, "offloaded embeddings (staging)");
      put_bf16(t, tmp.as<bf16>(), t.numel(), std, 0.0f);
      check(cudaMemcpy(hb.host(), tmp.get(), bytes, cudaMemcpyDeviceToHost), "offload embeddings");
    }
    const bf16* p = static_cast<const bf16*>(hb.device());
    m_.host_weight_bytes += bytes;
    m_.owned_host.push_back(std::move(hb));
    return p;
  }
  // fp32 vector; random ones are normal(mean, std)
  const float* vec(const model::Tensor& t, float mean, float std, int64_t offset = 0, int64_t count = -1) {
    const int64_t n = count < 0 ? t.numel() - offset : count;
    float* p = alloc<float>(size_t(n));
    if (has_data(t)) {
      std::vector<float> v = host_f32(t);
      check(cudaMemcpy(p, v.data() + offset, size_t(n) * 4, cudaMemcpyHostToDevice), "upload weights");
    } else {
      fill_normal_f32(p, n, next_seed(), mean, std, nullptr);
    }
    return p;
  }
  const bf16* vec_bf16(const model::Tensor& t, float std) {
    bf16* p = alloc<bf16>(size_t(t.numel()));
    put_bf16(t, p, t.numel(), std, 0.0f);
    return p;
  }
  // a + b (fp32, n values), a new weight vector
  const float* sum_vec(const float* a, const float* b, int64_t n) {
    float* p = alloc<float>(size_t(n));
    check(cudaMemcpy(p, a, size_t(n) * 4, cudaMemcpyDeviceToDevice), "upload weights");
    bias_act(p, 1, n, n, b, false, nullptr);
    return p;
  }
  const float* host_vec(const std::vector<float>& v) {
    float* p = alloc<float>(std::max<size_t>(v.size(), 1));
    if (!v.empty()) check(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload weights");
    return p;
  }
  static bool has_data(const model::Tensor& t) { return t.src || !t.v.empty(); }
  static std::vector<float> host_f32(const model::Tensor& t) { return t.v.empty() ? model::to_f32(*t.src) : t.v; }

 private:
  // The format a part runs in under o_.quant (spec/quant.md: decide by what the file holds).
  WFormat target(const model::Tensor& t, bool eligible) const {
    const Source src = source_of(t);
    const bool quantized_src = src == Source::Nvfp4 || src == Source::Fp8;
    // Plain tensors of a quantized folder are its keep-list: they stay bf16.
    const bool convert = quantized_src || (eligible && !folder_quantized_);
    switch (o_.quant) {
      case QuantMode::Auto:
        // FP8 weight-only folders (no dynamic input activations) run W8A16: dequantized to bf16
        if (src == Source::Fp8) return t.fp8_dynamic_activations ? WFormat::FP8 : WFormat::BF16;
        return src == Source::Nvfp4 ? WFormat::NVFP4 : WFormat::BF16;
      case QuantMode::BF16: return WFormat::BF16;
      case QuantMode::FP8: return convert ? WFormat::FP8 : WFormat::BF16;
      case QuantMode::NVFP4:
      case QuantMode::NVFP4_W4A16:
        // NVFP4 blocks are 16 inputs: like `clefrt quantize`, other widths stay bf16
        if (src != Source::Nvfp4 && t.shape.back() % 16 != 0) return WFormat::BF16;
        return convert ? WFormat::NVFP4 : WFormat::BF16;
    }
    return WFormat::BF16;
  }
  // W4A4's static activation scale (0: W4A16).
  float input_scale(const model::Tensor& t, WFormat f) const {
    if (f != WFormat::NVFP4 || o_.quant == QuantMode::NVFP4_W4A16) return 0.0f;
    const Source src = source_of(t);
    if (src == Source::Random) return o_.quant == QuantMode::NVFP4 ? o_.synthetic_input_global_scale : 0.0f;
    if (o_.quant == QuantMode::Auto) return src == Source::Nvfp4 ? t.input_global_scale : 0.0f;
    // --quant nvfp4: W4A4 needs a calibrated input scale from the folder.
    if (src == Source::Nvfp4 && t.input_global_scale > 0) return t.input_global_scale;
    if (src == Source::Nvfp4)
      throw load_error(t.name, "--quant nvfp4 (W4A4) needs input_global_scale, which this NVFP4 folder does not hold "
                               "(it is W4A16): use --quant nvfp4-w4a16");
    throw load_error(t.name, "--quant nvfp4 (W4A4) needs calibrated activation scales, which a " +
                                 std::string(src == Source::Fp8 ? "FP8" : "bf16") +
                                 " folder does not hold: make them with `clefrt quantize --scheme nvfp4 --calib FILE.jsonl`, "
                                 "or use --quant nvfp4-w4a16");
  }
  static size_t part_bytes(const DevLinearPart& p) {
    switch (p.fmt) {
      case WFormat::BF16: return size_t(p.n * p.k) * 2;
      case WFormat::NVFP4: return size_t(p.n * p.k / 2 + p.n * p.k / 16 + p.n * 4);
      case WFormat::FP8: return size_t(p.n * p.kp + p.n * 4);
    }
    return 0;
  }

  DevLinearPart make_part(const std::vector<const model::Tensor*>& g, WFormat f, float igs) {
    DevLinearPart p;
    p.fmt = f;
    p.k = g[0]->shape.back();
    for (auto* t : g) p.n += t->numel_rows();
    p.input_global_scale = igs;
    const int64_t n = p.n, k = p.k;
    bool all_nvfp4 = true, all_fp8 = true;
    for (auto* t : g) {
      all_nvfp4 &= source_of(*t) == Source::Nvfp4;
      all_fp8 &= source_of(*t) == Source::Fp8;
    }
    if (f == WFormat::BF16) {
      bf16* w = alloc<bf16>(size_t(n * k));
      fill_bf16_rows(g, w);
      p.w = w;
    } else if (f == WFormat::NVFP4) {
      uint8_t* packed = alloc<uint8_t>(size_t(n * k / 2));
      uint8_t* scales = alloc<uint8_t>(size_t(n * k / 16));
      float* gs = alloc<float>(size_t(n));
      std::vector<float> row_gs;
      if (all_nvfp4) {  // as the file holds them, byte for byte
        char *dp = reinterpret_cast<char*>(packed), *ds = reinterpret_cast<char*>(scales);
        for (auto* t : g) {
          check(cudaMemcpy(dp, t->src->data, t->src->nbytes, cudaMemcpyHostToDevice), "upload weights");
          check(cudaMemcpy(ds, t->scale_src->data, t->scale_src->nbytes, cudaMemcpyHostToDevice), "upload weights");
          dp += t->src->nbytes;
          ds += t->scale_src->nbytes;
          row_gs.insert(row_gs.end(), size_t(t->numel_rows()), t->weight_global_scale);
        }
      } else {  // quantized here from bf16, one global scale shared by the fused parts
        DeviceBuffer tmp(size_t(n * k) * 2, "weights (quantization staging)");
        fill_bf16_rows(g, tmp.as<bf16>());
        DeviceBuffer amax(4, "weights");
        check(cudaMemset(amax.get(), 0, 4), "quantize weights");
        amax_bf16(tmp.as<bf16>(), n * k, amax.as<float>(), nullptr);
        float a = 0;
        check(cudaMemcpy(&a, amax.get(), 4, cudaMemcpyDeviceToHost), "quantize weights");
        const float gsv = (a > 0 && std::isfinite(a)) ? 448.0f * 6.0f / a : 1.0f;
        nvfp4_quantize(tmp.as<bf16>(), n, k, gsv, packed, scales, nullptr);
        row_gs.assign(size_t(n), gsv);
      }
      check(cudaMemcpy(gs, row_gs.data(), row_gs.size() * 4, cudaMemcpyHostToDevice), "upload weights");
      // Blackwell W4A4: one global scale per part becomes the GEMM's alpha; the scales are laid
      // out once here as cuBLASLt wants them
      if (native_fp4_ && igs > 0 && std::all_of(row_gs.begin(), row_gs.end(), [&](float v) { return v == row_gs[0]; })) {
        uint8_t* sw = alloc<uint8_t>(size_t(nvfp4_swizzled_bytes(n, k)));
        nvfp4_swizzle_scales(scales, n, k, sw, nullptr);
        p.scales_swizzled = sw;
        p.part_gs = row_gs[0];
        m_.has_native_fp4 = true;
      }
      p.packed = packed;
      p.scales = scales;
      p.row_gs = gs;
      if (o_.w4a16_rs && !p.scales_swizzled && nvfp4_gemm_rs_available() && nvfp4_gemm_supports(k, k)) {
        p.rs = rs_tables(row_gs);
        if (p.rs) nvfp4_rs_repack(packed, n, k, nullptr);
      }
    } else {  // FP8
      p.kp = (k + 15) / 16 * 16;
      const int64_t kp = p.kp;
      uint8_t* q = alloc<uint8_t>(size_t(n * kp));
      float* rs = alloc<float>(size_t(n));
      if (all_fp8) {
        check(cudaMemset(q, 0, size_t(n * kp)), "upload weights");
        char* dq = reinterpret_cast<char*>(q);
        std::vector<float> scale;
        for (auto* t : g) {
          const int64_t rows = t->numel_rows();
          check(cudaMemcpy2D(dq, size_t(kp), t->src->data, size_t(k), size_t(k), size_t(rows), cudaMemcpyHostToDevice), "upload weights");
          dq += rows * kp;
          append_fp8_scales(*t, scale);
        }
        check(cudaMemcpy(rs, scale.data(), scale.size() * 4, cudaMemcpyHostToDevice), "upload weights");
      } else {
        DeviceBuffer tmp(size_t(n * k) * 2, "weights (quantization staging)");
        fill_bf16_rows(g, tmp.as<bf16>());
        fp8_quantize_rows(tmp.as<bf16>(), n, k, k, q, kp, rs, nullptr);
      }
      p.w8 = q;
      p.row_scale = rs;
    }
    check(cudaDeviceSynchronize(), "upload weights");
    return p;
  }
  // The short-input GEMM's tables of a part with these row global scales (none: it stays staged).
  Nvfp4RsTables rs_tables(const std::vector<float>& row_gs) {
    Nvfp4RsPlan plan;
    if (!nvfp4_rs_plan(row_gs.data(), int64_t(row_gs.size()), plan)) return {};
    return nvfp4_rs_upload(plan, alloc<uint8_t>(nvfp4_rs_bytes(plan)), nullptr);
  }
  static void append_fp8_scales(const model::Tensor& t, std::vector<float>& out) {
    std::vector<float> s(size_t(t.scale_src->numel()));
    std::memcpy(s.data(), t.scale_src->data, s.size() * 4);
    const size_t rows = size_t(t.numel_rows());
    for (size_t r = 0; r < rows; ++r) out.push_back(s.size() == 1 ? s[0] : s[r]);
  }
  // The bf16 values of a group's rows, whatever each part holds (dequantized on the GPU).
  void fill_bf16_rows(const std::vector<const model::Tensor*>& g, bf16* dst) {
    const int64_t cols = g[0]->shape.back();
    for (auto* t : g) {
      const int64_t rows = t->numel_rows(), n = rows * cols;
      const Source src = source_of(*t);
      if (src == Source::Nvfp4) {
        DeviceBuffer packed(t->src->nbytes, "weights (staging)"), scales(t->scale_src->nbytes, "weights (staging)");
        check(cudaMemcpy(packed.get(), t->src->data, t->src->nbytes, cudaMemcpyHostToDevice), "upload weights");
        check(cudaMemcpy(scales.get(), t->scale_src->data, t->scale_src->nbytes, cudaMemcpyHostToDevice), "upload weights");
        DeviceBuffer gs = upload(std::vector<float>(size_t(rows), t->weight_global_scale), "weights (staging)");
        nvfp4_dequantize(packed.as<uint8_t>(), scales.as<uint8_t>(), gs.as<float>(), rows, cols, dst, nullptr);
        check(cudaDeviceSynchronize(), "dequantize weights");
      } else if (src == Source::Fp8) {
        DeviceBuffer q(t->src->nbytes, "weights (staging)");
        check(cudaMemcpy(q.get(), t->src->data, t->src->nbytes, cudaMemcpyHostToDevice), "upload weights");
        std::vector<float> scale;
        append_fp8_scales(*t, scale);
        DeviceBuffer rs = upload(scale, "weights (staging)");
        fp8_dequantize_rows(q.as<uint8_t>(), cols, rs.as<float>(), rows, cols, dst, nullptr);
        check(cudaDeviceSynchronize(), "dequantize weights");
      } else {
        put_bf16(*t, dst, n, 1.0f / std::sqrt(float(cols)), 0.0f);
      }
      dst += n;
    }
  }
  void put_bf16(const model::Tensor& t, bf16* dst, int64_t n, float std, float mean) {
    if (t.src && t.src->dtype == io::DType::BF16) {
      check(cudaMemcpy(dst, t.src->data, size_t(n) * 2, cudaMemcpyHostToDevice), "upload weights");
    } else if (has_data(t)) {
      std::vector<float> v = host_f32(t);
      std::vector<uint16_t> b(v.size());
      for (size_t i = 0; i < v.size(); ++i) b[i] = io::f32_to_bf16(v[i]);
      check(cudaMemcpy(dst, b.data(), b.size() * 2, cudaMemcpyHostToDevice), "upload weights");
    } else {
      fill_normal_bf16(dst, n, next_seed(), mean, std, nullptr);
    }
  }
  // GPU memory for weights, from the model's pool (never freed before the model)
  template <class T>
  T* alloc(size_t count) { return m_.pool.alloc<T>(count, "weights"); }
  uint64_t next_seed() { return o_.seed * 1000003ull + counter_++; }

  DevModel& m_;
  const BuildOptions& o_;
  bool folder_quantized_, native_fp4_;
  uint64_t counter_ = 0;
};

DevLN ln(Builder& b, const model::LayerNormW& n) { return {b.vec(n.w, 1.0f, 0.1f), b.vec(n.b, 0.0f, 0.1f)}; }

// memory_kv: the MHA's k / v rows run over every memory token (cuBLASLt fp32), so its in_proj
// stays fp32; a self-attention's in_proj, like every out_proj, only meets question rows.
DevMha mha(Builder& b, const model::Mha& m, bool memory_kv) {
  DevMha r{memory_kv ? b.matrix32(m.in_w) : b.matrix_head(m.in_w), b.matrix_head(m.out_w), b.vec(m.in_b, 0.0f, 0.02f),
           b.vec(m.out_b, 0.0f, 0.02f)};
  if (memory_kv) std::tie(r.kv_hi, r.kv_lo) = b.tf32_planes(r.in, r.in.n / 3, 2 * (r.in.n / 3));
  return r;
}

}  // namespace

void trim_stack_reservation() { check(cudaDeviceSetLimit(cudaLimitStackSize, 0), "cudaDeviceSetLimit(stack size)"); }


DevModel build_device_model(const model::TextWeights& tw, const model::HeadWeights& hw, const model::TextConfig& c,
                            const model::HeadConfig& hc, const BuildOptions& o, const model::VisionWeights* vw,
                            const model::VisionConfig* vc) {
  trim_stack_reservation();
  DevModel m;
  m.c = c;
  m.hc = hc;
  bool folder_quantized = false;
  for (const auto& lw : tw.layers)
    for (const model::Tensor* t : {&lw.gate_proj, &lw.up_proj, &lw.down_proj, &lw.gdn.in_proj_qkv, &lw.gdn.out_proj, &lw.attn.q_proj,
                                   &lw.attn.o_proj})
      folder_quantized |= source_of(*t) == Source::Nvfp4 || source_of(*t) == Source::Fp8;
  bool native_fp4 = false;
  if (o.native_fp4) {
    int dev = 0, major = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "compute capability");
    native_fp4 = major >= 10;
  }
  Builder b(m, o, folder_quantized, native_fp4);
  m.embed = b.table(tw.embed, 1.0f);
  m.lm_head = (tw.embed.src && tw.lm_head.src == tw.embed.src) ? m.embed : b.table(tw.lm_head, 1.0f);
  m.final_norm = b.vec(tw.final_norm, 0.0f, 0.1f);
  {
    const int64_t R = c.rotary_dim();
    std::vector<float> inv(size_t(R / 2));
    for (int64_t i = 0; i < R / 2; ++i) inv[size_t(i)] = 1.0f / std::pow(float(c.rope_theta), float(2 * i) / float(R));
    m.inv_freq = b.host_vec(inv);
  }
  for (size_t i = 0; i < tw.layers.size(); ++i) {
    const model::LayerWeights& lw = tw.layers[i];
    DevLayer d{};
    d.type = lw.type;
    d.input_norm = b.vec(lw.input_norm, 0.0f, 0.1f);
    d.post_norm = b.vec(lw.post_norm, 0.0f, 0.1f);
    d.gate_up = b.linear({&lw.gate_proj, &lw.up_proj});
    d.down = b.linear({&lw.down_proj});
    if (lw.type == model::LayerType::LinearAttention) {
      const auto& g = lw.gdn;
      // in_proj_b / in_proj_a: kept in bf16 by the recipe (unless the folder holds them quantized)
      d.gdn_in = b.linear({&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a},
                          {quant::recipe_keeps_bf16("in_proj_qkv"), quant::recipe_keeps_bf16("in_proj_z"),
                           quant::recipe_keeps_bf16("in_proj_b"), quant::recipe_keeps_bf16("in_proj_a")});
      d.gdn_out = b.linear({&g.out_proj});
      d.conv_w = b.vec(g.conv1d, 0.0f, 0.5f);
      d.dt_bias = b.vec(g.dt_bias, 0.0f, 1.0f);
      std::vector<float> negA(size_t(c.v_heads));
      if (Builder::has_data(g.A_log)) {
        std::vector<float> alog = Builder::host_f32(g.A_log);
        for (size_t j = 0; j < negA.size(); ++j) negA[j] = -std::exp(alog[j]);
      } else {
        for (size_t j = 0; j < negA.size(); ++j) negA[j] = -std::exp(2.7f * float(j) / float(negA.size()));
      }
      d.neg_A = b.host_vec(negA);
      d.gdn_norm = b.vec(g.norm, 1.0f, 0.1f);
    } else {
      const auto& a = lw.attn;
      d.qkv = b.linear({&a.q_proj, &a.k_proj, &a.v_proj});
      d.o = b.linear({&a.o_proj});
      d.q_norm = b.vec(a.q_norm, 0.0f, 0.1f);
      d.k_norm = b.vec(a.k_norm, 0.0f, 0.1f);
    }
    m.layers.push_back(d);
    if (o.on_layer) o.on_layer(i + 1, tw.layers.size());
  }
  DevHead& h = m.head;
  h.hidden_norm = ln(b, hw.hidden_norm);
  h.option_summary_norm = ln(b, hw.option_summary_norm);
  h.field_norm = ln(b, hw.field_norm);
  h.option_norm = ln(b, hw.option_norm);
  h.memory_proj = b.matrix32(hw.memory_proj);
  std::tie(h.memory_proj.whi, h.memory_proj.wlo) = b.tf32_planes(h.memory_proj, 0, h.memory_proj.n);
  h.question_proj = b.matrix_head(hw.question_proj);
  h.option_question_proj = b.matrix_head(hw.option_question_proj);
  h.global_proj = b.matrix_head(hw.global_proj);
  h.option_context_proj = b.matrix_head(hw.option_context_proj);
  h.option_lexical_proj = b.matrix_head(hw.option_lexical_proj);
  h.type_emb = b.vec(hw.type_embedding, 0.0f, 1.0f);
  for (const auto& ev : hw.evidence) {
    DevHead::Evidence e;
    e.query_norm = ln(b, ev.query_norm);
    e.memory_norm = ln(b, ev.memory_norm);
    e.ff_norm = ln(b, ev.ff_norm);
    e.attn = mha(b, ev.attn, true);
    e.ff0 = b.matrix_head(ev.ff0_w);
    e.ff3 = b.matrix_head(ev.ff3_w);
    e.ff0_b = b.vec(ev.ff0_b, 0.0f, 0.02f);
    e.ff3_b = b.vec(ev.ff3_b, 0.0f, 0.02f);
    h.evidence.push_back(e);
  }
  for (const auto& dl : hw.layers) {
    DevHead::Decoder d;
    d.self_attn = mha(b, dl.self_attn, false);
    d.cross_attn = mha(b, dl.cross_attn, true);
    d.lin1 = b.matrix_head(dl.lin1_w);
    d.lin2 = b.matrix_head(dl.lin2_w);
    d.lin1_b = b.vec(dl.lin1_b, 0.0f, 0.02f);
    d.lin2_b = b.vec(dl.lin2_b, 0.0f, 0.02f);
    d.norm1 = ln(b, dl.norm1);
    d.norm2 = ln(b, dl.norm2);
    d.norm3 = ln(b, dl.norm3);
    h.layers.push_back(d);
  }
  h.scorer0 = b.matrix_head(hw.scorer0_w);
  h.scorer0_b = b.vec(hw.scorer0_b, 0.0f, 0.02f);
  h.scorer3_w = b.vec(hw.scorer3_w, 0.0f, 1.0f / std::sqrt(float(hw.scorer3_w.numel())));
  h.scorer3_b = Builder::has_data(hw.scorer3_b) ? Builder::host_f32(hw.scorer3_b)[0] : 0.0f;
  h.scalars.prior_scale = float(std::exp(std::min(double(hw.prior_logit_scale), std::log(100.0))));
  h.scalars.joint_scale = float(std::exp(std::min(double(hw.joint_logit_scale), std::log(100.0))));
  h.scalars.gate = float(1.0 / (1.0 + std::exp(-double(hw.residual_gate))));
  h.scalars.b3 = h.scorer3_b;
  if (vw && vc) {
    DevVision& v = m.vision;
    v.c = *vc;
    const int64_t hd = vc->hidden / vc->heads;
    if (vc->hidden % vc->heads || hd % 4 || !flash_attention_full_padded(hd))
      throw load_error("config.json", "vision_config head dim " + std::to_string(hd) +
                                          " is not supported by the CUDA vision tower (a multiple of 4, at most 128)");
    v.patch = b.matrix_bf16(vw->patch_w);
    v.patch_b = b.vec(vw->patch_b, 0.0f, 0.02f);
    v.pos_table = b.vec(vw->pos_embed, 0.0f, 0.5f);
    v.inv_freq = b.host_vec(model::vision_rotary_inv_freq(*vc));
    for (const model::VisionBlockWeights& bw : vw->blocks) {
      DevVisionBlock d;
      d.norm1 = ln(b, bw.norm1);
      d.norm2 = ln(b, bw.norm2);
      d.qkv = b.matrix_bf16(bw.qkv_w);
      d.proj = b.matrix_bf16(bw.proj_w);
      d.fc1 = b.matrix_bf16(bw.fc1_w);
      d.fc2 = b.matrix_bf16(bw.fc2_w);
      d.qkv_b = b.vec_bf16(bw.qkv_b, 0.02f);
      d.proj_b = b.vec(bw.proj_b, 0.0f, 0.02f);
      d.fc1_b = b.vec_bf16(bw.fc1_b, 0.02f);
      d.fc2_b = b.vec(bw.fc2_b, 0.0f, 0.02f);
      v.blocks.push_back(d);
    }
    // the biases proj and fc2 leave to the residual, summed in order for each LayerNorm that
    // reads it (vision_tower: x + the sum, x never rewritten)
    v.bias_before.assign(2 * v.blocks.size() + 1, nullptr);
    const float* run = nullptr;
    for (size_t l = 0; l < v.blocks.size(); ++l) {
      v.bias_before[2 * l] = run;
      run = run ? b.sum_vec(run, v.blocks[l].proj_b, vc->hidden) : v.blocks[l].proj_b;
      v.bias_before[2 * l + 1] = run;
      run = b.sum_vec(run, v.blocks[l].fc2_b, vc->hidden);
    }
    v.bias_before.back() = run;
    v.merger_norm = ln(b, vw->merger_norm);
    v.merger_fc1 = b.matrix_bf16(vw->merger_fc1_w);
    v.merger_fc2 = b.matrix_bf16(vw->merger_fc2_w);
    v.merger_fc1_b = b.vec(vw->merger_fc1_b, 0.0f, 0.02f);
    v.merger_fc2_b = b.vec(vw->merger_fc2_b, 0.0f, 0.02f);
    m.has_vision = true;
  }
  check(cudaDeviceSynchronize(), "upload weights");
  m.weight_bytes = m.pool.used();
  m.weight_reserved_bytes = m.pool.reserved();
  return m;
}

}  // namespace clefrt::cuda
