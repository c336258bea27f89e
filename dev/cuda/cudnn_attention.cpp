// cuDNN's fused attention at the vision tower's and the backbone's shapes, through cuDNN's backend
// (graph) API, beside the product's kernels (flash_attention_full, flash_attention): issue 19's
// tower and issue 20's 8,192-token point need attention at cuDNN's level (PyTorch's cuDNN SDPA:
// 0.145 ms a tower block at 3,072 patches against our 0.234; 1.35 ms a backbone layer at 8,192
// tokens against our ~5.7; bench/results). This program is the first step of using it
// ourselves: it builds the graph cuDNN's flash engine matches (Q K^T, a scale, for the backbone
// a causal mask, softmax as max / subtract / exp / sum / divide, P V), reading the product's
// layouts directly (the tower's q / k / v [patches, heads, Dp] with the head dims padded, the
// backbone's q [tokens, 24, 256] and k / v [tokens, 4, 256]: GQA), and prints per shape:
//   ours       the product's kernel (no output gate), ms and TF/s
//   cudnn      the plan's execution, ms, TF/s, the largest |difference| from ours (both bf16;
//              ours is within the GPU tests' bounds of the CPU's fp32) and any output that is not
//              finite or not written (the buffer starts as NaN), the engine
//              configuration taken (the heuristic's first that finalizes) and the time to build
//              the plan (paid per new shape unless plans are cached)
//   invariant  with several sequences: the first one alone (batch 1) against the same sequence
//              inside the batch, outputs differing in any bit (0: its answer does not depend on
//              its batch, which the product needs)
// Usage: clefrt_bench_cudnn_attn [--commit ID] [--json FILE]
// Run with cuDNN 9's libraries on LD_LIBRARY_PATH (the GPU machine: PyTorch's nvidia-cudnn-cu13).
#include <cuda_runtime.h>
#include <cudnn.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/ops/kernels.h"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/hardware.h"
#include "gpu_bench.h"

using namespace clefrt;
using namespace clefrt::cuda;

namespace {

void ck(cudnnStatus_t s, const char* what, int line) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  char msg[4096] = {0};
  cudnnGetLastErrorString(msg, sizeof msg);
  throw std::runtime_error(std::string(what) + " (cudnn_attention.cpp:" + std::to_string(line) + "): " + cudnnGetErrorString(s) +
                           (msg[0] ? std::string("; ") + msg : std::string()));
}
#define CK(x) ck((x), #x, __LINE__)

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t t) { CK(cudnnBackendCreateDescriptor(t, &d_)); }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  cudnnBackendDescriptor_t get() const { return d_; }
  Desc& set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void* v) {
    CK(cudnnBackendSetAttribute(d_, a, t, n, v));
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t a, const Desc& d) {
    cudnnBackendDescriptor_t p = d.get();
    return set(a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
  }
  Desc& finalize() {
    CK(cudnnBackendFinalize(d_));
    return *this;
  }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// Deprecated in cuDNN 9 but still read by the graph and plan descriptors of the versions here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr cudnnBackendAttributeName_t kGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

struct Dims {
  int64_t d[4];
  int64_t s[4];
};

Desc tensor(int64_t uid, cudnnDataType_t dt, const Dims& g, bool is_virtual, bool by_value = false) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t align = 16;
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, g.d)
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, g.s)
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align)
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  return std::move(t.finalize());
}

// The attention of `b` sequences of `s` tokens each: q [b * s, hq, dq], k / v [b * s, hkv, dq]
// (bf16; head h's first d of its dq dims), o packed [b * s, hq, d] (bf16); causal or not.
struct Shape {
  int64_t b, s, hq, hkv, d, dq;
  bool causal;
};

class Attention {
 public:
  Attention(cudnnHandle_t handle, const Shape& g) : handle_(handle) {
    enum : int64_t { Q = 1, K, V, O, SCALE, NEG, S1 = 100, S2, RI, CI, MASK, S3, MX, SUB, EX, SUM, P, LG, STATS };
    const int64_t b = g.b, s = g.s, hq = g.hq, hkv = g.hkv, d = g.d, dq = g.dq;
    const Dims q{{b, hq, s, d}, {s * hq * dq, dq, hq * dq, 1}};
    const Dims kt{{b, hkv, d, s}, {s * hkv * dq, dq, 1, hkv * dq}};  // K^T: the last two dims' strides swapped
    const Dims v{{b, hkv, s, d}, {s * hkv * dq, dq, hkv * dq, 1}};
    const Dims o{{b, hq, s, d}, {s * hq * d, d, hq * d, 1}};
    const Dims scores{{b, hq, s, s}, {hq * s * s, s * s, s, 1}};
    const Dims rows{{b, hq, s, 1}, {hq * s, s, 1, 1}};
    const Dims scalar{{1, 1, 1, 1}, {1, 1, 1, 1}};
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    keep(Q, tensor(Q, CUDNN_DATA_BFLOAT16, q, false));
    keep(K, tensor(K, CUDNN_DATA_BFLOAT16, kt, false));
    keep(V, tensor(V, CUDNN_DATA_BFLOAT16, v, false));
    keep(O, tensor(O, CUDNN_DATA_BFLOAT16, o, false));
    keep(SCALE, tensor(SCALE, f32, scalar, false, true));
    for (int64_t uid : {int64_t(S1), int64_t(S2), int64_t(SUB), int64_t(EX)}) keep(uid, tensor(uid, f32, scores, true));
    // the probabilities in the inputs' type: the backend takes bmm2's A in the i/o type (as
    // cudnn-frontend sets it)
    keep(P, tensor(P, CUDNN_DATA_BFLOAT16, scores, true));
    for (int64_t uid : {int64_t(MX), int64_t(SUM), int64_t(LG), int64_t(STATS)}) keep(uid, tensor(uid, f32, rows, true));

    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32).finalize();
    ops_.push_back(matmul(Q, K, S1, mm));
    ops_.push_back(pointwise(CUDNN_POINTWISE_MUL, S1, SCALE, S2));
    int64_t scores_in = S2;
    if (g.causal) {  // keep key col <= query row: row index >= col index, else the lowest float
      keep(NEG, tensor(NEG, f32, scalar, false, true));
      for (int64_t uid : {int64_t(RI), int64_t(CI), int64_t(S3)}) keep(uid, tensor(uid, f32, scores, true));
      keep(MASK, tensor(MASK, CUDNN_DATA_BOOLEAN, scores, true));
      ops_.push_back(pointwise(CUDNN_POINTWISE_GEN_INDEX, S2, -1, RI, -1, f32, 2));
      ops_.push_back(pointwise(CUDNN_POINTWISE_GEN_INDEX, S2, -1, CI, -1, f32, 3));
      ops_.push_back(pointwise(CUDNN_POINTWISE_CMP_GE, RI, CI, MASK, -1, CUDNN_DATA_BOOLEAN));
      ops_.push_back(pointwise(CUDNN_POINTWISE_BINARY_SELECT, S2, NEG, S3, MASK));
      scores_in = S3;
    }
    ops_.push_back(reduction(CUDNN_REDUCE_TENSOR_MAX, scores_in, MX));
    ops_.push_back(pointwise(CUDNN_POINTWISE_SUB, scores_in, MX, SUB));
    ops_.push_back(pointwise(CUDNN_POINTWISE_EXP, SUB, -1, EX));
    ops_.push_back(reduction(CUDNN_REDUCE_TENSOR_ADD, EX, SUM));
    // the softmax statistics (max + log sum), virtual: cudnn-frontend builds them even for
    // inference, and the flash engine's pattern has them
    ops_.push_back(pointwise(CUDNN_POINTWISE_LOG, SUM, -1, LG));
    ops_.push_back(pointwise(CUDNN_POINTWISE_ADD, MX, LG, STATS));
    ops_.push_back(pointwise(CUDNN_POINTWISE_DIV, EX, SUM, P));
    ops_.push_back(matmul(P, V, O, mm));
    descs_.push_back(std::move(mm));
    causal_ = g.causal;
    const auto t0 = std::chrono::steady_clock::now();
    Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    std::vector<cudnnBackendDescriptor_t> raw;
    for (const Desc& op : ops_) raw.push_back(op.get());
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(raw.size()), raw.data())
        .set(kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle_)
        .finalize();
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph).set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode).finalize();
    int64_t count = 0;
    CK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    if (count == 0) throw std::runtime_error("cuDNN's heuristic offers no engine for this attention graph");
    std::vector<Desc> cfgs;
    std::vector<cudnnBackendDescriptor_t> cfg_raw;
    for (int64_t i = 0; i < count; ++i) {
      cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      cfg_raw.push_back(cfgs.back().get());
    }
    int64_t got = 0;
    CK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg_raw.data()));
    std::string errors;
    for (int64_t i = 0; i < got && !plan_; ++i) {  // the first configuration that finalizes
      try {
        auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        plan->set(kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle_).set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[size_t(i)]).finalize();
        plan_ = std::move(plan);
        config_ = int(i);
      } catch (const std::exception& e) {
        errors += std::string(errors.empty() ? "" : " | ") + e.what();
      }
    }
    if (!plan_) throw std::runtime_error("no engine configuration of " + std::to_string(got) + " finalizes: " + errors);
    CK(cudnnBackendGetAttribute(plan_->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &workspace_bytes_));
    build_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    descs_.push_back(std::move(graph));
    descs_.push_back(std::move(heur));
    for (Desc& c : cfgs) descs_.push_back(std::move(c));
    scale_ = float(1.0 / std::sqrt(double(g.d)));
    if (workspace_bytes_ > 0) workspace_ = DeviceBuffer(size_t(workspace_bytes_), "cuDNN workspace");
  }

  // The variant pack is built once per set of buffers (its host work stays out of the timing).
  void run(const bf16* q, const bf16* k, const bf16* v, bf16* o, cudaStream_t st) {
    CK(cudnnSetStream(handle_, st));
    const std::vector<const void*> bufs = {q, k, v, o};
    if (!pack_ || bufs != pack_bufs_) {
      int64_t uids[] = {1, 2, 3, 4, 5, 6};
      void* ptrs[] = {const_cast<bf16*>(q), const_cast<bf16*>(k), const_cast<bf16*>(v), o, &scale_, &neg_};
      const int64_t n = causal_ ? 6 : 5;
      void* ws = workspace_.get();
      pack_ = std::make_unique<Desc>(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
      pack_->set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids)
          .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs)
          .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)
          .finalize();
      pack_bufs_ = bufs;
    }
    CK(cudnnBackendExecute(handle_, plan_->get(), pack_->get()));
  }

  double build_ms() const { return build_ms_; }
  int config() const { return config_; }
  int64_t workspace_bytes() const { return workspace_bytes_; }

 private:
  void keep(int64_t uid, Desc&& t) { tensors_.emplace(uid, std::move(t)); }
  const Desc& t(int64_t uid) const {
    auto it = tensors_.find(uid);
    if (it == tensors_.end()) throw std::runtime_error("no tensor " + std::to_string(uid));
    return it->second;
  }
  Desc matmul(int64_t a, int64_t b, int64_t c, const Desc& mm) {
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, t(a))
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, t(b))
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, t(c))
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm)
        .finalize();
    return op;
  }
  // y = mode(x[, b[, tsel]]): tsel is BINARY_SELECT's condition; axis for GEN_INDEX
  Desc pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t b, int64_t y, int64_t tsel = -1, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode).set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pw.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const float one = 1.0f;
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw).set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, t(x));
    if (b >= 0) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, t(b));
    if (tsel >= 0) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t(tsel));
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, t(y))
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one)
        .finalize();
    descs_.push_back(std::move(pw));
    return op;
  }
  Desc reduction(cudnnReduceTensorOp_t r, int64_t x, int64_t y) {
    Desc rd(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    rd.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &r).set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32).finalize();
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, t(x)).set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, t(y)).set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd).finalize();
    descs_.push_back(std::move(rd));
    return op;
  }

  cudnnHandle_t handle_;
  std::map<int64_t, Desc> tensors_;
  std::vector<Desc> ops_, descs_;
  std::unique_ptr<Desc> plan_, pack_;
  std::vector<const void*> pack_bufs_;
  int config_ = -1;
  int64_t workspace_bytes_ = 0;
  DeviceBuffer workspace_;
  double build_ms_ = 0;
  bool causal_ = false;
  float scale_ = 1, neg_ = std::numeric_limits<float>::lowest();  // by value: read at each execution
};

std::vector<uint16_t> down_bf16(const bf16* p, size_t n) {
  std::vector<uint16_t> h(n);
  check(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost), "download");
  return h;
}
float bf(uint16_t u) {
  const uint32_t w = uint32_t(u) << 16;
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt;
  if (!bench::parse_options(argc, argv, false, opt)) return 2;
  try {
    const HardwareLimits hw = bench::measure_and_print_hardware();
    std::printf("cuDNN %zu (built against %d.%d.%d)\n", cudnnGetVersion(), CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
    cudaStream_t st;
    check(cudaStreamCreate(&st), "stream");
    cudnnHandle_t handle;
    CK(cudnnCreate(&handle));
    // the 27B tower: 16 heads of 72 (padded to 80 in the product's layout), frames of one
    // 1024x768 image, one 2048x2048, four 512x512; the 27B backbone: 24 query heads, 4 key /
    // value heads of 256, causal, the blog request, 8,192 tokens, 8 x 1,024
    const int64_t dp = flash_attention_full_padded(72);
    struct Point {
      const char* name;
      Shape g;
    };
    const std::vector<Point> points = {
        {"tower 1 x 3,072 (1024x768)", {1, 3072, 16, 16, 72, dp, false}},
        {"tower 1 x 16,384 (2048x2048)", {1, 16384, 16, 16, 72, dp, false}},
        {"tower 4 x 1,024 (512x512)", {4, 1024, 16, 16, 72, dp, false}},
        {"backbone 1 x 318 (blog)", {1, 318, 24, 4, 256, 256, true}},
        {"backbone 1 x 8,192", {1, 8192, 24, 4, 256, 256, true}},
        {"backbone 8 x 1,024", {8, 1024, 24, 4, 256, 256, true}},
    };
    json::Value records = json::Value::array();
    for (const Point& pt : points) {
      const Shape& g = pt.g;
      const int64_t L = g.b * g.s, nq = L * g.hq * g.dq, nkv = L * g.hkv * g.dq, no = L * g.hq * g.d, first = g.s * g.hq * g.d;
      DeviceBuffer q(size_t(nq) * 2, "q"), k(size_t(nkv) * 2, "k"), v(size_t(nkv) * 2, "v"), ours(size_t(no) * 2, "ours"),
          theirs(size_t(no) * 2, "cudnn"), alone(size_t(first) * 2, "alone");
      // random O(1) values, the padding dims zero as the product's rotary kernel writes them
      fill_normal_bf16(q.as<bf16>(), nq, 21, 0.0f, 1.0f, st);
      fill_normal_bf16(k.as<bf16>(), nkv, 22, 0.0f, 1.0f, st);
      fill_normal_bf16(v.as<bf16>(), nkv, 23, 0.0f, 1.0f, st);
      if (g.dq > g.d) {
        check(cudaMemset2DAsync(q.as<bf16>() + g.d, size_t(g.dq) * 2, 0, size_t(g.dq - g.d) * 2, size_t(L * g.hq), st), "zero padding");
        for (DeviceBuffer* b : {&k, &v})
          check(cudaMemset2DAsync(b->as<bf16>() + g.d, size_t(g.dq) * 2, 0, size_t(g.dq - g.d) * 2, size_t(L * g.hkv), st), "zero padding");
      }
      const int64_t tile = g.causal ? 64 : flash_attention_full_tile();
      std::vector<int32_t> tq, ts, te;
      for (int64_t f = 0; f < g.b; ++f)
        for (int64_t t = 0; t < g.s; t += tile) {
          tq.push_back(int32_t(f * g.s + t));
          ts.push_back(int32_t(f * g.s));
          te.push_back(int32_t((f + 1) * g.s));
        }
      std::vector<int32_t> tiles = tq;
      tiles.insert(tiles.end(), ts.begin(), ts.end());
      tiles.insert(tiles.end(), te.begin(), te.end());
      DeviceBuffer dt(tiles.size() * 4, "tiles");
      check(cudaMemcpy(dt.get(), tiles.data(), tiles.size() * 4, cudaMemcpyHostToDevice), "tiles");
      const int64_t nt = int64_t(tq.size());
      const AttnTiles at{dt.as<int32_t>(), dt.as<int32_t>() + nt, dt.as<int32_t>() + 2 * nt, nt};
      const double flop = 4.0 * double(g.b) * double(g.s) * double(g.s) * double(g.d) * double(g.hq) * (g.causal ? 0.5 : 1.0);
      auto tf = [&](double ms) { return flop / (ms * 1e-3) / 1e12; };
      auto run_ours = [&] {
        if (g.causal)
          flash_attention(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), g.hkv * g.dq, nullptr, 0, 0, g.hq, g.hkv, g.d, at, ours.as<bf16>(), st);
        else
          flash_attention_full(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), g.hq, g.d, at, ours.as<bf16>(), st);
      };
      const double t_ours = bench::median_ms(st, run_ours);
      std::printf("\n%s: ours %.3f ms %.0f TF/s\n", pt.name, t_ours, tf(t_ours));
      json::Value r = json::Value::object();
      r.add("shape", json::Value::string(pt.name));
      r.add("useful_tflop", json::Value::number(flop / 1e12));
      r.add("ours_ms", json::Value::number(t_ours));
      check(cudaMemset(theirs.get(), 0xFF, theirs.bytes()), "fill with NaN");  // what cuDNN does not write shows
      try {
        Attention fa(handle, g);
        const double t_cudnn = bench::median_ms(st, [&] { fa.run(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), theirs.as<bf16>(), st); });
        run_ours();
        check(cudaStreamSynchronize(st), "sync");
        const auto a = down_bf16(ours.as<bf16>(), size_t(no)), b = down_bf16(theirs.as<bf16>(), size_t(no));
        double worst = 0;
        size_t non_finite = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          const double d = std::fabs(double(bf(a[i])) - double(bf(b[i])));
          if (!std::isfinite(double(bf(b[i])))) ++non_finite;
          else if (!(d <= worst)) worst = d;
        }
        std::string inv = non_finite ? ", " + std::to_string(non_finite) + " cuDNN outputs not finite (or not written)" : "";
        r.add("cudnn_non_finite_outputs", json::Value::integer(int64_t(non_finite)));
        if (g.b > 1) {  // the first sequence alone against the same sequence in the batch
          try {
            Shape one_g = g;
            one_g.b = 1;
            Attention one(handle, one_g);
            one.run(q.as<bf16>(), k.as<bf16>(), v.as<bf16>(), alone.as<bf16>(), st);
            check(cudaStreamSynchronize(st), "sync");
            const auto c = down_bf16(alone.as<bf16>(), size_t(first));
            size_t differ = 0;
            for (size_t i = 0; i < c.size(); ++i) differ += c[i] != b[i];
            inv += ", first sequence alone vs in the batch: " + std::to_string(differ) + " of " + std::to_string(c.size()) + " outputs differ";
            r.add("alone_vs_batch_differing", json::Value::integer(int64_t(differ)));
          } catch (const std::exception& e) {
            inv += std::string(", the sequence alone: ") + e.what();
          }
        }
        std::printf("  cudnn %.3f ms %.0f TF/s (%.2fx ours; %.0f%% of the measured bf16 GEMM peak), engine config %d of the heuristic's, "
                    "workspace %lld B, plan built in %.1f ms; max |cudnn - ours| %.3g%s\n",
                    t_cudnn, tf(t_cudnn), t_ours / t_cudnn, 100.0 * tf(t_cudnn) / hw.peak_bf16_tflops, fa.config(),
                    (long long)fa.workspace_bytes(), fa.build_ms(), worst, inv.c_str());
        r.add("cudnn_ms", json::Value::number(t_cudnn));
        r.add("cudnn_plan_build_ms", json::Value::number(fa.build_ms()));
        r.add("cudnn_engine_config", json::Value::integer(fa.config()));
        r.add("max_abs_diff_vs_ours", json::Value::number(worst));
      } catch (const std::exception& e) {
        std::printf("  cudnn: %s\n", e.what());
        r.add("cudnn_error", json::Value::string(e.what()));
      }
      records.arr.push_back(std::move(r));
    }
    if (!opt.json_out.empty()) bench::write_record(opt.json_out, hw, opt.commit, "clefrt_bench_cudnn_attn", std::move(records));
    cudnnDestroy(handle);
    cudaStreamDestroy(st);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clefrt_bench_cudnn_attn: %s\n", e.what());
    return 1;
  }
  return 0;
}
