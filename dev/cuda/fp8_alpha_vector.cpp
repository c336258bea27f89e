// A probe for a lead of docs/notes/fp8-gemm-design.md ("cuBLASLt's alpha vector"): does
// cuBLASLt's FP8 e4m3 GEMM on this GPU take alpha as a device vector, one value per row of D
// (CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO)? Our GEMMs put the Linear's output
// features on D's rows (Gemm::run_fp8: D is n x m), so that vector would be the weights'
// per-channel scale cs, applied inside the GEMM instead of by the pass after it (the FP8 SwiGLU
// reads 2 ffn column scales a row from L2 today).
//
// Per shape (27B gate|up and down) and m (318, 8,192): how many algorithms the heuristic offers
// with the vector (0, or the status it answered, is the answer "no"); whether the first of them
// without split-K runs; its time beside the scalar-alpha GEMM's (the engine's batch-invariant
// one, Gemm::run_fp8); and its bf16 output against bf16(cs[row] * the scalar GEMM's fp32 output)
// (equal: the vector is applied to the fp32 sum before the one rounding; the product's FP8 bits
// are bf16(bf16(sum) * rs * cs), so either way the answers move and the accuracy tests decide).
// Random inputs. Usage: clefrt_bench_fp8_alpha [--commit ID] [--json FILE] [--m M]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/json.h"
#include "cuda/ops/kernels.h"
#include "cuda/ops/kernels_quant.h"
#include "cuda/runtime/buffer.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/gemm.h"
#include "gpu_bench.h"

using namespace clefrt;
using namespace clefrt::cuda;

namespace {

// One FP8 GEMM D[n, m] = alpha[row] * W x^T in cuBLASLt with alpha a device vector of n floats
// (beta zero), bf16 out: its descriptor, layouts and the first heuristic algorithm without
// split-K or a reduction scheme (the engine's batch-invariance rule).
struct AlphaVectorGemm {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  int offered = 0;   // heuristic results with the vector
  bool runs = false;  // one without split-K was found
  std::string status = "ok";

  AlphaVectorGemm(int64_t m, int64_t n, int64_t k, size_t ws) {
    check(cublasLtCreate(&lt), "cublasLtCreate");
    check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "alpha vector desc");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const int32_t mode = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "alpha vector desc");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "alpha vector desc");
    if (const cublasStatus_t st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof mode);
        st != CUBLAS_STATUS_SUCCESS) {
      status = "the pointer mode refused: cuBLASLt status " + std::to_string(int(st));
      return;
    }
    check(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), k), "alpha vector layout");
    check(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), k), "alpha vector layout");
    check(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, uint64_t(n), uint64_t(m), n), "alpha vector layout");
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "alpha vector preference");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "alpha vector preference");
    std::vector<cublasLtMatmulHeuristicResult_t> res(16);
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, c, pref, int(res.size()), res.data(), &offered);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS) {
      status = "cuBLASLt status " + std::to_string(int(st)) + (st == CUBLAS_STATUS_NOT_SUPPORTED ? " (not supported)" : st == CUBLAS_STATUS_INVALID_VALUE ? " (invalid value)" : "");
      offered = 0;
      return;
    }
    for (int i = 0; i < offered && !runs; ++i) {
      int32_t splitk = 1;
      uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
      size_t got = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&res[size_t(i)].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &got);
      cublasLtMatmulAlgoConfigGetAttribute(&res[size_t(i)].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme, &got);
      if (splitk <= 1 && scheme == CUBLASLT_REDUCTION_SCHEME_NONE) algo = res[size_t(i)].algo, runs = true;
    }
    if (!runs) status = "only split-K algorithms offered";
  }
  ~AlphaVectorGemm() {
    for (cublasLtMatrixLayout_t l : {a, b, c})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (lt) cublasLtDestroy(lt);
  }
  AlphaVectorGemm(const AlphaVectorGemm&) = delete;
  AlphaVectorGemm& operator=(const AlphaVectorGemm&) = delete;

  void run(const float* alpha, const void* w8, const void* x8, void* y, void* ws, size_t ws_bytes, cudaStream_t s) {
    const float beta = 0.0f;  // BETA_ZERO: not read, passed for the signature
    check(cublasLtMatmul(lt, desc, alpha, w8, a, x8, b, &beta, y, c, y, c, &algo, ws, ws_bytes, s), "alpha vector matmul");
  }
};

// Outputs of `got` (bf16 D[n, m]) that differ in any bit from bf16(cs[row] * f32[row, col]).
int64_t mismatches_against_scaled(const DeviceBuffer& got, const DeviceBuffer& f32, const std::vector<float>& cs, int64_t m, int64_t n,
                                  cudaStream_t s) {
  std::vector<uint16_t> g(size_t(m * n));
  std::vector<float> f(size_t(m * n));
  check(cudaMemcpyAsync(g.data(), got.get(), g.size() * 2, cudaMemcpyDeviceToHost, s), "alpha vector out");
  check(cudaMemcpyAsync(f.data(), f32.get(), f.size() * 4, cudaMemcpyDeviceToHost, s), "alpha vector out");
  check(cudaStreamSynchronize(s), "alpha vector out");
  int64_t bad = 0;
  for (int64_t t = 0; t < m; ++t)
    for (int64_t r = 0; r < n; ++r) {
      const __nv_bfloat16 want = __float2bfloat16_rn(cs[size_t(r)] * f[size_t(t * n + r)]);
      uint16_t wb;
      std::memcpy(&wb, &want, 2);
      bad += wb != g[size_t(t * n + r)];
    }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Options opt;
  if (!bench::parse_options(argc, argv, false, opt)) return 2;
  try {
    const HardwareLimits hw = bench::measure_and_print_hardware();
    cudaStream_t s;
    check(cudaStreamCreate(&s), "stream");
    Gemm inv(s, true);
    const size_t ws_bytes = size_t(32) << 20;
    DeviceBuffer ws(ws_bytes, "cuBLASLt workspace");
    std::vector<int64_t> ms = {318, 8192};
    if (opt.only_m > 0) ms = {opt.only_m};
    json::Value shapes = json::Value::array();
    struct Shape {
      const char* name;
      int64_t n, k;
    };
    for (Shape sh : {Shape{"mlp gate_up", 34816, 5120}, Shape{"mlp down", 5120, 17408}}) {
      const int64_t n = sh.n, k = sh.k, mmax = *std::max_element(ms.begin(), ms.end());
      DeviceBuffer w(size_t(n * k) * 2, "W"), w8(size_t(n * k), "W fp8"), cs(size_t(n) * 4, "W scales"), x(size_t(mmax * k) * 2, "x"),
          x8(size_t(mmax * k), "x fp8"), xs(size_t(mmax) * 4, "x scales"), y(size_t(mmax * n) * 2, "y"), yv(size_t(mmax * n) * 2, "y vector"),
          y32(size_t(mmax * n) * 4, "y fp32");
      fill_normal_bf16(w.as<bf16>(), n * k, 21, 0.0f, 0.02f, s);
      fill_normal_bf16(x.as<bf16>(), mmax * k, 22, 0.0f, 1.0f, s);
      fp8_quantize_rows(w.as<bf16>(), n, k, k, w8.as<uint8_t>(), k, cs.as<float>(), s);
      fp8_quantize_rows(x.as<bf16>(), mmax, k, k, x8.as<uint8_t>(), k, xs.as<float>(), s);
      std::vector<float> cs_h(static_cast<size_t>(n));
      check(cudaMemcpyAsync(cs_h.data(), cs.get(), cs_h.size() * 4, cudaMemcpyDeviceToHost, s), "scales");
      check(cudaStreamSynchronize(s), "scales");
      std::printf("\n%s: n %lld, k %lld\n", sh.name, (long long)n, (long long)k);
      json::Value rows = json::Value::array();
      for (int64_t m : ms) {
        json::Value r = json::Value::object();
        r.add("m", json::Value::integer(m));
        AlphaVectorGemm av(m, n, k, ws_bytes);
        r.add("offered", json::Value::integer(av.offered));
        r.add("status", json::Value::string(av.status));
        const double t_scalar = bench::median_ms(s, [&] { inv.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y.get(), OutType::BF16, n, "bench"); });
        const double t_scale = bench::median_ms(s, [&] { scale_rows_cols_bf16(y.as<bf16>(), m, n, n, xs.as<float>(), cs.as<float>(), s); });
        r.add("scalar_alpha_ms", json::Value::number(t_scalar));
        r.add("scale_pass_ms", json::Value::number(t_scale));
        if (!av.runs) {
          std::printf("m %6lld  alpha vector: not available (%d offered; %s) | scalar alpha %.3f ms, scale pass %.3f ms\n", (long long)m, av.offered,
                      av.status.c_str(), t_scalar, t_scale);
          rows.arr.push_back(std::move(r));
          continue;
        }
        const double t_vec = bench::median_ms(s, [&] { av.run(cs.as<float>(), w8.get(), x8.get(), yv.get(), ws.get(), ws_bytes, s); });
        inv.run_fp8(x8.as<uint8_t>(), m, k, w8.as<uint8_t>(), n, y32.get(), OutType::F32, n, "bench");
        av.run(cs.as<float>(), w8.get(), x8.get(), yv.get(), ws.get(), ws_bytes, s);
        const int64_t bad = mismatches_against_scaled(yv, y32, cs_h, m, n, s);
        // the same algorithm with alpha 1 everywhere: whether it sums as the engine's algorithm does
        // (if not, the mismatches above are its summation order, not where alpha is applied)
        const std::vector<float> ones_h(static_cast<size_t>(n), 1.0f);
        DeviceBuffer ones(size_t(n) * 4, "ones");
        check(cudaMemcpyAsync(ones.get(), ones_h.data(), ones_h.size() * 4, cudaMemcpyHostToDevice, s), "ones");
        av.run(ones.as<float>(), w8.get(), x8.get(), yv.get(), ws.get(), ws_bytes, s);
        const int64_t bad1 = mismatches_against_scaled(yv, y32, ones_h, m, n, s);
        std::printf("m %6lld  alpha vector: %d offered, %.3f ms | scalar alpha %.3f ms (%.3fx), scale pass %.3f ms | "
                    "outputs != bf16(cs * fp32 sum): %lld of %lld (alpha 1: != bf16(sum) %lld)\n",
                    (long long)m, av.offered, t_vec, t_scalar, t_vec / t_scalar, t_scale, (long long)bad, (long long)(m * n), (long long)bad1);
        r.add("alpha_vector_ms", json::Value::number(t_vec));
        r.add("mismatches_vs_scaled_fp32", json::Value::integer(bad));
        r.add("mismatches_alpha_one_vs_fp32", json::Value::integer(bad1));
        rows.arr.push_back(std::move(r));
      }
      shapes.arr.push_back(bench::shape_record(sh.name, n, k, std::move(rows)));
    }
    if (!opt.json_out.empty()) bench::write_record(opt.json_out, hw, opt.commit, "clefrt_bench_fp8_alpha", std::move(shapes));
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clefrt_bench_fp8_alpha: %s\n", e.what());
    return 1;
  }
  return 0;
}
