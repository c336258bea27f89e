#include "cuda/runtime/graph_cache.h"

#include <exception>

#include "common/error.h"
#include "common/json.h"
#include "common/log_event.h"
#include "cuda/runtime/check.h"

namespace clefrt::cuda {

namespace {
constexpr int kMaxFailures = 2;
}

GraphCache::GraphCache(int64_t after, size_t max_execs, size_t max_keys) : after_(after), max_execs_(max_execs), max_keys_(max_keys) {
  if (after < 2) throw Error(Status::Internal, "internal_error", "CUDA graphs: a shape is captured at its second sighting at the earliest");
  if (max_execs == 0 || max_keys <= max_execs) throw Error(Status::Internal, "internal_error", "CUDA graphs: bad cache bounds");
}

GraphCache::~GraphCache() {
  for (auto& [k, e] : entries_) drop_exec(e);
}

void GraphCache::drop_exec(Entry& e) {
  if (e.exec) cudaGraphExecDestroy(e.exec);
  if (e.graph) cudaGraphDestroy(e.graph);
  e.exec = nullptr;
  e.graph = nullptr;
  e.copy_nodes.clear();
}

void GraphCache::copy(const Copy& c, cudaStream_t s) {
  check(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, s), "prefix state copy");
  if (!capturing_) return;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  size_t n = 0;
  const cudaError_t e = cudaStreamGetCaptureInfo(s, &st, nullptr, nullptr, &deps, nullptr, &n);
  if (e != cudaSuccess || st != cudaStreamCaptureStatusActive || n != 1) {  // the copy's node is the stream's one frontier
    if (note_error_.empty())
      note_error_ = std::string("a copy's graph node: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "not the capture's one frontier");
    return;
  }
  noted_.push_back(deps[0]);
}

size_t GraphCache::held() const {
  size_t n = 0;
  for (const auto& [k, e] : entries_) n += e.exec != nullptr;
  return n;
}

void GraphCache::evict_exec() {
  Entry* old = nullptr;
  for (auto& [k, e] : entries_)
    if (e.exec && (!old || e.used < old->used)) old = &e;
  if (old) drop_exec(*old);
}

// The least recently used key without a graph, a refused one only when every such key is (there
// is one without a graph: max_keys > max_execs), so that a refused shape stays refused while it
// is seen
void GraphCache::evict_key() {
  auto old = entries_.end();
  auto older = [&](std::map<std::vector<int64_t>, Entry>::iterator it) {
    if (old == entries_.end()) return true;
    if (it->second.refused != old->second.refused) return !it->second.refused;
    return it->second.used < old->second.used;
  };
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (!it->second.exec && older(it)) old = it;
  if (old != entries_.end()) entries_.erase(old);
}

void GraphCache::refuse(Entry& e, const std::string& why) {
  e.refused = true;
  if (++failures_ == 1 || failures_ == kMaxFailures)
    log_event("\"event\":\"cuda_graphs\",\"capture\":\"failed\",\"why\":" + json::write(json::Value::string(why)) +
              (failures_ >= kMaxFailures ? ",\"cuda_graphs\":\"off\"" : ""));
  if (failures_ >= kMaxFailures)  // off: the graphs held go too
    for (auto& [k, other] : entries_) drop_exec(other);
}

// A graph of work, or why not: empty on success (e.exec set)
std::string GraphCache::capture(Entry& e, cudaStream_t s, const std::function<void()>& work, size_t copies) {
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "CUDA graph capture");
  capturing_ = true;
  noted_.clear();
  note_error_.clear();
  std::string thrown;
  try {
    work();
  } catch (const std::exception& ex) {
    thrown = ex.what();
  } catch (...) {
    thrown = "an exception of an unknown type";
  }
  capturing_ = false;
  cudaGraph_t g = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &g);  // ends the capture whatever happened in it
  cudaGetLastError();  // capture's errors are not sticky; leave none behind for the next check
  if (thrown.empty() && end == cudaSuccess && g && noted_.size() != copies)
    thrown = note_error_.empty() ? "the work issued " + std::to_string(noted_.size()) + " copies of " + std::to_string(copies) : note_error_;
  if (!thrown.empty() || end != cudaSuccess || !g) {
    if (g) cudaGraphDestroy(g);
    return thrown.empty() ? std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end) : thrown;
  }
  if (held() >= max_execs_) evict_exec();
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, g, 0);
  if (inst != cudaSuccess) {
    cudaGraphDestroy(g);
    cudaGetLastError();
    return std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
  }
  e.exec = exec;
  if (copies) {  // the nodes are the graph's: it stays while the exec does
    e.graph = g;
    e.copy_nodes = noted_;
  } else {
    cudaGraphDestroy(g);
  }
  return {};
}

bool GraphCache::run(const std::vector<int64_t>& key, cudaStream_t s, const std::function<void()>& work, const std::vector<Copy>& copies) {
  if (failures_ >= kMaxFailures) {
    work();
    return false;
  }
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (entries_.size() >= max_keys_) evict_key();
    it = entries_.emplace(key, Entry{}).first;
  }
  Entry& e = it->second;
  e.used = ++clock_;
  if (!e.exec && (e.refused || e.seen + 1 < after_)) {
    work();
    ++e.seen;  // only a forward that completed counts: the capture relies on its tuned GEMMs and built plans
    return false;
  }
  if (!e.exec) {
    const std::string why = capture(e, s, work, copies.size());
    if (!why.empty()) {
      work();  // what the capture recorded did not run: now it does (rethrowing an error of the work's own)
      refuse(e, why);  // the work runs eagerly, so the capture was at fault
      return false;
    }
  } else {  // this batch's copies: the same sizes, other addresses
    if (copies.size() != e.copy_nodes.size())
      throw Error(Status::Internal, "internal_error", "CUDA graph replay: " + std::to_string(copies.size()) + " copies for a graph of " +
                                                          std::to_string(e.copy_nodes.size()));
    for (size_t i = 0; i < copies.size(); ++i)
      check(cudaGraphExecMemcpyNodeSetParams1D(e.exec, e.copy_nodes[i], copies[i].dst, copies[i].src, copies[i].bytes, cudaMemcpyDeviceToDevice),
            "CUDA graph replay: a prefix state copy");
  }
  check(cudaGraphLaunch(e.exec, s), "CUDA graph launch");
  ++replays_;
  return true;
}

}  // namespace clefrt::cuda
