// cuDNN's fused attention: the graph cuDNN's flash engine matches, as cudnn-frontend lowers its
// SDPA node (Q K^T with the sequences' lengths as M / N overrides, a scale, the padding mask, the
// bottom-right causal mask, softmax as max / subtract / exp / sum / divide with its statistics,
// P V), built with the backend API through a dlopen'd libcudnn.so.9.
#include "cuda/runtime/cudnn_attention.h"

#include <cudnn.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "cuda/runtime/check.h"

namespace clefrt::cuda {
namespace {

// The backend API's functions, from the library opened at run time.
struct Api {
  size_t (*GetVersion)();
  cudnnStatus_t (*Create)(cudnnHandle_t*);
  cudnnStatus_t (*Destroy)(cudnnHandle_t);
  cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
  const char* (*GetErrorString)(cudnnStatus_t);
  void (*GetLastErrorString)(char*, size_t);
  cudnnStatus_t (*CreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t*);
  cudnnStatus_t (*DestroyDescriptor)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*SetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t, int64_t, const void*);
  cudnnStatus_t (*GetAttribute)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t, int64_t, int64_t*,
                                void*);
  cudnnStatus_t (*Finalize)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*Execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
};

struct Loaded {
  Api api{};
  bool ok = false;
  std::string why;
  size_t version = 0;
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    void* lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      r.why = std::string("libcudnn.so.9 does not load (") + (e ? e : "?") + "): install cuDNN 9 (NVIDIA's cudnn9-cuda-13 package) or put it on "
              "LD_LIBRARY_PATH";
      return r;
    }
    bool all = true;
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
      if (!f) {
        all = false;
        r.why = std::string("libcudnn.so.9 lacks ") + name;
      }
    };
    Api& a = r.api;
    sym(a.GetVersion, "cudnnGetVersion");
    sym(a.Create, "cudnnCreate");
    sym(a.Destroy, "cudnnDestroy");
    sym(a.SetStream, "cudnnSetStream");
    sym(a.GetErrorString, "cudnnGetErrorString");
    sym(a.GetLastErrorString, "cudnnGetLastErrorString");
    sym(a.CreateDescriptor, "cudnnBackendCreateDescriptor");
    sym(a.DestroyDescriptor, "cudnnBackendDestroyDescriptor");
    sym(a.SetAttribute, "cudnnBackendSetAttribute");
    sym(a.GetAttribute, "cudnnBackendGetAttribute");
    sym(a.Finalize, "cudnnBackendFinalize");
    sym(a.Execute, "cudnnBackendExecute");
    if (!all) return r;
    r.version = a.GetVersion();
    if (r.version < kCudnnMinVersion) {
      r.why = "cuDNN " + std::to_string(r.version) + " is older than " + std::to_string(kCudnnMinVersion) +
              " (the fused attention's padding and bottom-right causal masks)";
      return r;
    }
    r.ok = true;
    return r;
  }();
  return l;
}

const Api& api() {
  const Loaded& l = loaded();
  if (!l.ok) throw Error(Status::Internal, "device_error", "cuDNN: " + l.why);
  return l.api;
}

void ck(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  char msg[2048] = {0};
  api().GetLastErrorString(msg, sizeof msg);
  throw Error(Status::Internal, "device_error",
              std::string("cuDNN attention: ") + what + ": " + api().GetErrorString(s) + (msg[0] ? std::string("; ") + msg : std::string()));
}

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t t) { ck(api().CreateDescriptor(t, &d_), "create a descriptor"); }
  ~Desc() {
    if (d_) api().DestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  cudnnBackendDescriptor_t get() const { return d_; }
  Desc& set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void* v) {
    ck(api().SetAttribute(d_, a, t, n, v), "set an attribute");
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t a, const Desc& d) {
    cudnnBackendDescriptor_t p = d.get();
    return set(a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
  }
  Desc& finalize(const char* what = "finalize a descriptor") {
    ck(api().Finalize(d_), what);
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

Desc tensor(int64_t uid, cudnnDataType_t dt, const Dims& g, bool is_virtual, bool by_value = false, const Desc* ragged_offset = nullptr) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t align = 16;  // the bf16 tensors' rows and append_ragged's arrays start at multiples of 16 bytes
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, g.d)
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, g.s)
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align)
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  if (ragged_offset) t.set_desc(CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, *ragged_offset);
  return std::move(t.finalize("finalize a tensor"));
}

enum : int64_t {
  Q = 1, K, V, O, SCALE, NEG, SQ, SKV, QOFF, KOFF, VOFF, OOFF,
  S1 = 100, S2, RI, CI, MASK, S3, MX, SUB, EX, SUM, P, LG, STATS, PRI, PCI, PRM, PCM, PM, CRI, CCI, CRA, CRB, S4
};

}  // namespace

struct CudnnGraph::Descs {
  std::map<int64_t, Desc> tensors;
  std::vector<Desc> ops, other;
  std::unique_ptr<Desc> plan, pack;
  std::vector<const void*> pack_bufs;

  const Desc& t(int64_t uid) const {
    auto it = tensors.find(uid);
    if (it == tensors.end()) throw Error(Status::Internal, "internal_error", "cuDNN attention: no tensor " + std::to_string(uid));
    return it->second;
  }
  void keep(int64_t uid, Desc&& d) { tensors.emplace(uid, std::move(d)); }
  // m / n / k: the uids of per-sequence overrides (-1: none)
  void matmul(int64_t a, int64_t b, int64_t c, const Desc& mm, int64_t m, int64_t n, int64_t k) {
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, t(a))
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, t(b))
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, t(c))
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    if (m >= 0) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, t(m));
    if (n >= 0) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, t(n));
    if (k >= 0) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, t(k));
    ops.push_back(std::move(op.finalize("finalize a matmul")));
  }
  // y = mode(x[, b[, tsel]]): tsel is BINARY_SELECT's condition; axis for GEN_INDEX and index sums
  void pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t b, int64_t y, int64_t tsel = -1, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode).set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pw.finalize("finalize a pointwise");
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const float one = 1.0f;
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw).set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, t(x));
    if (b >= 0) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, t(b));
    if (tsel >= 0) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t(tsel));
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, t(y))
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one)
        .finalize("finalize a pointwise operation");
    other.push_back(std::move(pw));
    ops.push_back(std::move(op));
  }
  void reduction(cudnnReduceTensorOp_t r, int64_t x, int64_t y) {
    Desc rd(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    rd.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &r)
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32)
        .finalize("finalize a reduction");
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, t(x))
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, t(y))
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd)
        .finalize("finalize a reduction operation");
    other.push_back(std::move(rd));
    ops.push_back(std::move(op));
  }
};

bool cudnn_available(std::string* why) {
  const Loaded& l = loaded();
  if (!l.ok && why) *why = l.why;
  return l.ok;
}

size_t cudnn_loaded_version() { return loaded().ok ? loaded().version : 0; }

CudnnGraph::CudnnGraph(void* handle, const CudnnShape& g) : handle_(handle), g_(g), d_(std::make_unique<Descs>()) {
  Descs& D = *d_;
  const int64_t b = g.b, sq = g.sq, skv = g.skv, hq = g.hq, hkv = g.hkv, d = g.d;
  const Dims q{{b, hq, sq, d}, {sq * g.ldq, g.hsq, g.ldq, 1}};
  const Dims kt{{b, hkv, d, skv}, {skv * g.ldk, g.hsk, 1, g.ldk}};  // K^T: the last two dims' strides swapped
  const Dims v{{b, hkv, skv, d}, {skv * g.ldv, g.hsv, g.ldv, 1}};
  const Dims o{{b, hq, sq, d}, {sq * g.ldo, g.hso ? g.hso : d, g.ldo, 1}};
  const Dims scores{{b, hq, sq, skv}, {hq * sq * skv, sq * skv, skv, 1}};
  const Dims rows{{b, hq, sq, 1}, {hq * sq, sq, 1, 1}};
  const Dims scalar{{1, 1, 1, 1}, {1, 1, 1, 1}};
  const Dims per_seq{{b, 1, 1, 1}, {1, 1, 1, 1}};
  const Dims offsets{{b + 1, 1, 1, 1}, {1, 1, 1, 1}};
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32, boolean = CUDNN_DATA_BOOLEAN;
  const auto t0 = std::chrono::steady_clock::now();
  if (g.ragged) {
    for (int64_t uid : {int64_t(QOFF), int64_t(KOFF), int64_t(VOFF), int64_t(OOFF)}) D.keep(uid, tensor(uid, i32, offsets, false));
    for (int64_t uid : {int64_t(SQ), int64_t(SKV)}) D.keep(uid, tensor(uid, i32, per_seq, false));
  }
  auto io = [&](int64_t uid, const Dims& dims, int64_t off) {
    D.keep(uid, tensor(uid, CUDNN_DATA_BFLOAT16, dims, false, false, g.ragged ? &D.t(off) : nullptr));
  };
  io(Q, q, QOFF);
  io(K, kt, KOFF);
  io(V, v, VOFF);
  io(O, o, OOFF);
  D.keep(SCALE, tensor(SCALE, f32, scalar, false, true));
  D.keep(NEG, tensor(NEG, f32, scalar, false, true));
  for (int64_t uid : {int64_t(S1), int64_t(S2), int64_t(SUB), int64_t(EX)}) D.keep(uid, tensor(uid, f32, scores, true));
  // the probabilities in the inputs' type: the backend takes bmm2's A in the i/o type (as
  // cudnn-frontend sets it)
  D.keep(P, tensor(P, CUDNN_DATA_BFLOAT16, scores, true));
  for (int64_t uid : {int64_t(MX), int64_t(SUM), int64_t(LG), int64_t(STATS)}) D.keep(uid, tensor(uid, f32, rows, true));

  Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32).finalize("finalize the matmuls' descriptor");
  // ragged: Q K^T's M / N and P V's M / K are each sequence's own lengths
  D.matmul(Q, K, S1, mm, g.ragged ? int64_t(SQ) : -1, g.ragged ? int64_t(SKV) : -1, -1);
  D.pointwise(CUDNN_POINTWISE_MUL, S1, SCALE, S2);
  int64_t scores_in = S2;
  if (g.ragged) {  // the padding mask: row < seq_q and col < seq_kv, else -inf
    for (int64_t uid : {int64_t(PRI), int64_t(PCI)}) D.keep(uid, tensor(uid, i32, scores, true));
    for (int64_t uid : {int64_t(PRM), int64_t(PCM), int64_t(PM)}) D.keep(uid, tensor(uid, boolean, scores, true));
    D.keep(S3, tensor(S3, f32, scores, true));
    D.pointwise(CUDNN_POINTWISE_GEN_INDEX, S2, -1, PRI, -1, i32, 2);
    D.pointwise(CUDNN_POINTWISE_GEN_INDEX, S2, -1, PCI, -1, i32, 3);
    D.pointwise(CUDNN_POINTWISE_CMP_LT, PRI, SQ, PRM, -1, boolean);
    D.pointwise(CUDNN_POINTWISE_CMP_LT, PCI, SKV, PCM, -1, boolean);
    D.pointwise(CUDNN_POINTWISE_LOGICAL_AND, PRM, PCM, PM, -1, boolean);
    D.pointwise(CUDNN_POINTWISE_BINARY_SELECT, S2, NEG, S3, PM);
    scores_in = S3;
  }
  if (g.causal && g.ragged) {  // bottom-right: row + seq_kv - seq_q >= col (cudnn-frontend's composite band mask)
    for (int64_t uid : {int64_t(CRI), int64_t(CCI), int64_t(CRA), int64_t(CRB)}) D.keep(uid, tensor(uid, i32, scores, true));
    D.keep(MASK, tensor(MASK, boolean, scores, true));
    D.keep(S4, tensor(S4, f32, scores, true));
    D.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores_in, -1, CRI, -1, i32, 2);
    D.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores_in, -1, CCI, -1, i32, 3);
    D.pointwise(CUDNN_POINTWISE_ADD, CRI, SKV, CRA, -1, i32, 3);
    D.pointwise(CUDNN_POINTWISE_SUB, CRA, SQ, CRB, -1, i32, 3);
    D.pointwise(CUDNN_POINTWISE_CMP_GE, CRB, CCI, MASK, -1, boolean);
    D.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores_in, NEG, S4, MASK);
    scores_in = S4;
  } else if (g.causal) {  // top-left: row index >= col index, else the lowest float
    for (int64_t uid : {int64_t(RI), int64_t(CI), int64_t(S3)}) D.keep(uid, tensor(uid, f32, scores, true));
    D.keep(MASK, tensor(MASK, boolean, scores, true));
    D.pointwise(CUDNN_POINTWISE_GEN_INDEX, S2, -1, RI, -1, f32, 2);
    D.pointwise(CUDNN_POINTWISE_GEN_INDEX, S2, -1, CI, -1, f32, 3);
    D.pointwise(CUDNN_POINTWISE_CMP_GE, RI, CI, MASK, -1, boolean);
    D.pointwise(CUDNN_POINTWISE_BINARY_SELECT, S2, NEG, S3, MASK);
    scores_in = S3;
  }
  D.reduction(CUDNN_REDUCE_TENSOR_MAX, scores_in, MX);
  D.pointwise(CUDNN_POINTWISE_SUB, scores_in, MX, SUB);
  D.pointwise(CUDNN_POINTWISE_EXP, SUB, -1, EX);
  D.reduction(CUDNN_REDUCE_TENSOR_ADD, EX, SUM);
  // the softmax statistics (max + log sum), virtual: cudnn-frontend builds them even for
  // inference, and the flash engine's pattern has them
  D.pointwise(CUDNN_POINTWISE_LOG, SUM, -1, LG);
  D.pointwise(CUDNN_POINTWISE_ADD, MX, LG, STATS);
  D.pointwise(CUDNN_POINTWISE_DIV, EX, SUM, P);
  D.matmul(P, V, O, mm, g.ragged ? int64_t(SQ) : -1, -1, g.ragged ? int64_t(SKV) : -1);
  D.other.push_back(std::move(mm));

  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> raw;
  for (const Desc& op : D.ops) raw.push_back(op.get());
  cudnnHandle_t h = static_cast<cudnnHandle_t>(handle_);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(raw.size()), raw.data())
      .set(kGraphHandle, CUDNN_TYPE_HANDLE, 1, &h)
      .finalize("finalize the attention graph");
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode)
      .finalize("finalize the heuristic");
  int64_t count = 0;
  ck(api().GetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr), "count the engines");
  if (count == 0) throw Error(Status::Internal, "device_error", "cuDNN attention: the heuristic offers no engine for this graph");
  std::vector<Desc> cfgs;
  std::vector<cudnnBackendDescriptor_t> cfg_raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    cfg_raw.push_back(cfgs.back().get());
  }
  int64_t got = 0;
  ck(api().GetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg_raw.data()), "list the engines");
  std::string errors;
  for (int64_t i = 0; i < got && !D.plan; ++i) {  // the first configuration that finalizes
    try {
      auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan->set(kPlanHandle, CUDNN_TYPE_HANDLE, 1, &h).set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[size_t(i)]).finalize("finalize a plan");
      D.plan = std::move(plan);
      config_ = int(i);
    } catch (const Error& e) {
      errors += std::string(errors.empty() ? "" : " | ") + e.what();
    }
  }
  if (!D.plan)
    throw Error(Status::Internal, "device_error", "cuDNN attention: none of the " + std::to_string(got) + " engine configurations plans: " + errors);
  ck(api().GetAttribute(D.plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &workspace_bytes_), "workspace size");
  build_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  D.other.push_back(std::move(graph));
  D.other.push_back(std::move(heur));
  for (Desc& c : cfgs) D.other.push_back(std::move(c));
  scale_ = float(1.0 / std::sqrt(double(g.d)));
  // dense graphs mask with the lowest float, ragged ones with -inf (cudnn-frontend's choice from
  // cuDNN 9.10; a fully masked row cannot occur: every query sees at least its own key)
  neg_ = g.ragged ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::lowest();
  if (workspace_bytes_ > 0) workspace_ = DeviceBuffer(size_t(workspace_bytes_), "cuDNN attention workspace");
}

CudnnGraph::~CudnnGraph() = default;

void CudnnGraph::run(const bf16* q, const bf16* k, const bf16* v, bf16* o, cudaStream_t s, const CudnnRagged* r) {
  Descs& D = *d_;
  cudnnHandle_t h = static_cast<cudnnHandle_t>(handle_);
  ck(api().SetStream(h, s), "set the stream");
  std::vector<const void*> bufs = {q, k, v, o};
  if (g_.ragged) {
    if (!r) throw Error(Status::Internal, "internal_error", "cuDNN attention: a ragged graph without its offsets and lengths");
    bufs.insert(bufs.end(), {r->q_off, r->k_off, r->v_off, r->o_off, r->seq_q, r->seq_kv});
  }
  if (!D.pack || bufs != D.pack_bufs) {  // the variant pack is rebuilt when the buffers move
    std::vector<int64_t> uids = {Q, K, V, O, SCALE};
    std::vector<void*> ptrs = {const_cast<bf16*>(q), const_cast<bf16*>(k), const_cast<bf16*>(v), o, &scale_};
    if (g_.causal || g_.ragged) {  // the masks' value: a pack may not name a tensor its graph lacks
      uids.push_back(NEG);
      ptrs.push_back(&neg_);
    }
    if (g_.ragged) {
      uids.insert(uids.end(), {SQ, SKV, QOFF, KOFF, VOFF, OOFF});
      for (const int32_t* p : {r->seq_q, r->seq_kv, r->q_off, r->k_off, r->v_off, r->o_off}) ptrs.push_back(const_cast<int32_t*>(p));
    }
    void* ws = workspace_.get();
    auto pack = std::make_unique<Desc>(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack->set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data())
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()), ptrs.data())
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)
        .finalize("finalize the variant pack");
    D.pack = std::move(pack);
    D.pack_bufs = bufs;
  }
  ck(api().Execute(h, D.plan->get(), D.pack->get()), "execute");
  if (sync_each_launch()) check(cudaStreamSynchronize(s), "cuDNN attention");
}

CudnnHandle::CudnnHandle() {
  cudnnHandle_t h = nullptr;
  ck(api().Create(&h), "create a handle");
  h_ = h;
}

CudnnHandle::~CudnnHandle() {
  if (h_ && loaded().ok) loaded().api.Destroy(static_cast<cudnnHandle_t>(h_));
}

namespace {
int64_t up4(int64_t n) { return (n + 3) / 4 * 4; }
}  // namespace

size_t ragged_ints(int64_t b) { return size_t(4 * up4(b + 1) + 2 * up4(b) + 3); }

size_t append_ragged(std::vector<int32_t>& out, const std::vector<RaggedSeq>& seqs, int64_t b, int64_t ldq, int64_t ldk, int64_t ldv,
                     int64_t ldo) {
  while (out.size() % 4) out.push_back(0);  // 16-byte aligned from a 16-byte aligned base
  const size_t at = out.size();
  const int64_t n = int64_t(seqs.size()), b1 = up4(b + 1), bb = up4(b);
  out.resize(at + size_t(4 * b1 + 2 * bb), 0);
  int32_t* qo = out.data() + at;
  int32_t *ko = qo + b1, *vo = ko + b1, *oo = vo + b1, *sq = oo + b1, *skv = sq + bb;
  int64_t qend = 0, kend = 0;
  auto i32 = [](int64_t x) {
    if (x < 0 || x > std::numeric_limits<int32_t>::max())
      throw Error(Status::Internal, "internal_error", "cuDNN attention: an element offset past int32 (" + std::to_string(x) + ")");
    return int32_t(x);
  };
  for (int64_t i = 0; i <= b; ++i) {  // the empty sequences after the last start where it ends
    const bool real = i < n;
    const int64_t qr = real ? seqs[size_t(i)].qrow : qend, kr = real ? seqs[size_t(i)].krow : kend;
    qo[i] = i32(qr * ldq);
    ko[i] = i32(kr * ldk);
    vo[i] = i32(kr * ldv);
    oo[i] = i32(qr * ldo);
    if (i < b) {
      sq[i] = real ? i32(seqs[size_t(i)].qlen) : 0;
      skv[i] = real ? i32(seqs[size_t(i)].kvlen) : 0;
    }
    if (real) {
      qend = qr + seqs[size_t(i)].qlen;
      kend = kr + seqs[size_t(i)].kvlen;
    }
  }
  return at;
}

CudnnRagged ragged_at(const int32_t* base, int64_t b) {
  const int64_t b1 = up4(b + 1), bb = up4(b);
  return {base, base + b1, base + 2 * b1, base + 3 * b1, base + 4 * b1, base + 4 * b1 + bb};
}

int64_t cudnn_bound(int64_t n, int64_t from) {
  int64_t b = from;
  while (b < n) b *= 2;
  return b;
}

CudnnAttention::CudnnAttention(int64_t hq, int64_t hkv, int64_t d) : hq_(hq), hkv_(hkv), d_(d) {}

void CudnnAttention::run(const bf16* q, const bf16* k, const bf16* v, int64_t ldv, bf16* o, const CudnnRagged& r, int64_t b, int64_t max_kv,
                         cudaStream_t s) {
  if (b == 0) return;
  const int64_t nb = cudnn_bound(b, 1), ns = cudnn_bound(max_kv);
  CudnnGraph* g = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto& slot = plans_[{nb, ns, ldv}];
    // queries are bounded by the keys: one bound for both (a continuation's few queries leave
    // most of the plan's query tiles empty, which cost a launch slot each, not a pass)
    if (!slot)
      slot = std::make_unique<CudnnGraph>(handle_.get(), CudnnShape{nb, ns, ns, hq_, hkv_, d_, hq_ * d_, d_, hkv_ * d_, d_, ldv, d_, hq_ * d_,
                                                                    true, true});
    g = slot.get();
  }
  g->run(q, k, v, o, s, &r);
}

CudnnFrameAttention::CudnnFrameAttention(int64_t heads, int64_t d, int64_t dp, int64_t ld)
    : heads_(heads), d_(d), dp_(dp), ld_(ld ? ld : heads * dp) {
  if (d > dp) throw Error(Status::Internal, "internal_error", "cuDNN frame attention: head dims " + std::to_string(d) + " > padded " + std::to_string(dp));
  if (dp % 8 || ld_ % 8 || ld_ < heads * dp)  // heads and rows 16-byte aligned, as the graph's tensors are declared
    throw Error(Status::Internal, "internal_error",
                "cuDNN frame attention: heads " + std::to_string(dp) + " apart in rows of " + std::to_string(ld_) + " (multiples of 8, rows >= heads)");
  plan(1, cudnn_bound(1));
}

// Not causal; q, k, v and o in rows of ld, head h at h * dp (o over q)
CudnnShape CudnnFrameAttention::shape(int64_t nb, int64_t ns, bool ragged) const {
  const int64_t ld = ld_;
  return CudnnShape{nb, ns, ns, heads_, heads_, d_, ld, dp_, ld, dp_, ld, dp_, ld, false, ragged, dp_};
}

CudnnGraph& CudnnFrameAttention::plan(int64_t nb, int64_t ns) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& slot = plans_[{nb, ns}];
  if (!slot) slot = std::make_unique<CudnnGraph>(handle_.get(), shape(nb, ns, true));
  return *slot;
}

void CudnnFrameAttention::run(bf16* q, const bf16* k, const bf16* v, const CudnnRagged& r, int64_t b, int64_t longest, cudaStream_t s) {
  if (b == 0) return;
  if (dense(longest))
    throw Error(Status::Internal, "internal_error", "cuDNN frame attention: a frame of " + std::to_string(longest) + " patches in a ragged launch");
  plan(cudnn_bound(b, 1), cudnn_bound(longest)).run(q, k, v, q, s, &r);
}

void CudnnFrameAttention::run_dense(bf16* q, const bf16* k, const bf16* v, int64_t n, cudaStream_t s) {
  if (!dense(n))
    throw Error(Status::Internal, "internal_error", "cuDNN frame attention: a frame of " + std::to_string(n) + " patches in a dense launch");
  CudnnGraph* g = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = dense_.find(n);
    if (it == dense_.end()) {
      if (dense_.size() >= kDensePlans) {  // the least recently used goes (cudaFree of its workspace waits for the device)
        auto old = dense_.begin();
        for (auto i = dense_.begin(); i != dense_.end(); ++i)
          if (i->second.second < old->second.second) old = i;
        dense_.erase(old);
      }
      it = dense_.emplace(n, std::make_pair(std::make_unique<CudnnGraph>(handle_.get(), shape(1, n, false)), uint64_t(0))).first;  // no mask
    }
    it->second.second = ++uses_;
    g = it->second.first.get();
  }
  g->run(q, k, v, q, s);
}

std::string CudnnAttention::describe() const {
  const size_t v = cudnn_loaded_version();
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) + " fused attention";
}

}  // namespace clefrt::cuda
