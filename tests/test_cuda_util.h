// Helpers of the GPU tests (tests/test_cuda_*.cpp): skipping without a GPU, moving buffers,
// reading the oracle fixtures, comparing answers and hidden states with the CPU engine.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/runtime/buffer.h"
#include "cuda/model/device_model.h"
#include "cuda/model/forward.h"
#include "cuda/ops/kernels.h"
#include "engine/engine_core.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/weights.h"
#include "schema/request.h"
#include "test_util.h"

#define NEED_GPU()                                  \
  do {                                              \
    std::string why;                                \
    if (!clefrt::cuda_available(&why)) GTEST_SKIP() << why; \
  } while (0)

namespace clefrt::test {

// A folder's weights on the GPU as a bare cuda::Forward takes them (FP8 activations quantized per
// token at run time, as the engine loads them), the Linears converted to `q` at load.
// w4a16_rs: BuildOptions::w4a16_rs (false for the fused W4A16 kernel, which reads the file's code order)
inline cuda::DevModel device_model_of(const std::string& dir, QuantMode q = QuantMode::Auto, bool w4a16_rs = true) {
  const auto cfg = model::load_config(dir);
  io::TensorStore st = io::TensorStore::open_folder(dir), hs;
  hs.add_file(dir + "/joint_head.safetensors");
  model::QuantActivations qa;
  qa.fp8_dynamic = true;
  const auto tw = model::load_text_weights(st, cfg.text, model::LoadMode::Lazy, qa);
  const auto hw = model::load_head_weights(hs, cfg.head, model::LoadMode::Lazy);
  cuda::BuildOptions bo;
  bo.w4a16_rs = w4a16_rs;
  bo.quant = q;
  return cuda::build_device_model(tw, hw, cfg.text, cfg.head, bo);
}

inline std::vector<cuda::bf16> to_bf(const std::vector<float>& v) {
  std::vector<cuda::bf16> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = __float2bfloat16(v[i]);
  return b;
}
template <class T>
std::vector<T> down(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  cuda::check(cudaDeviceSynchronize(), "test sync");
  cuda::check(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost), "test download");
  return v;
}
inline std::vector<float> down_bf(const cuda::DeviceBuffer& b, size_t n) {
  auto h = down<cuda::bf16>(b, n);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

// An oracle fixture's requests (encoded by `e`), expected probabilities and request texts.
struct Fixture {
  std::vector<Encoded> enc;
  std::vector<std::vector<std::vector<double>>> want;
  std::vector<std::string> raw;
};
inline Fixture read_fixture(const EngineCore& e, const std::string& name) {
  Fixture f;
  std::istringstream in(read_file(source_path("tests/fixtures/oracle/" + name + ".expected.jsonl")));
  std::string line;
  while (std::getline(in, line)) {
    auto rec = json::parse(line);
    f.enc.push_back(e.encoder().encode(parse_request(*rec.find("request"))));
    f.raw.push_back(json::write(*rec.find("request")));
    f.want.push_back(probs_of(*rec.find("probs")));
  }
  return f;
}

// The first n backbone layers for one request: max |h_gpu - h_cpu| / max |h_cpu|, the CPU run
// with the GPU's bf16 rounding points (`full`: weights loaded LoadMode::Full).
inline double first_layers_rel_diff(const model::TextWeights& full, const model::TextConfig& c, const cuda::DevModel& dm, const Encoded& e,
                                    int64_t n) {
  model::TextWeights part = full;
  part.layers.resize(size_t(n));
  auto hc = model::backbone_forward_bf16_points(part, c, e.input_ids, {0, int64_t(e.input_ids.size())});
  cuda::ForwardOptions po;
  po.debug_layers = n;
  po.max_tokens = int64_t(e.input_ids.size());
  cuda::Forward pf(dm, po);
  auto hg = pf.hidden_states({&e});
  double scale = 0, diff = 0;
  for (size_t k = 0; k < hc.size(); ++k) {
    scale = std::max(scale, double(std::fabs(hc[k])));
    diff = std::max(diff, double(std::fabs(hc[k] - hg[k])));
  }
  return diff / scale;
}

}  // namespace clefrt::test
