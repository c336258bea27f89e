// CUDA graphs of repeated work: the same launches, with the same arguments and addresses, keyed
// by what determines them (for the forward: the batch's shape). A key's first sightings run the
// work as it is; at the `after`-th it is captured into a graph, and from then on the graph is
// replayed, its kernels back to back without the host's launch calls between them.
//
// The caller guarantees that the key determines every launch's arguments and every device
// address the work touches (the arena is carved the same way for the same shape), and that the
// work neither synchronizes nor reads host memory asynchronously (capture refuses the first and
// would freeze the second's address). The exception: device-to-device copies issued through
// copy(), whose addresses (not sizes) may change between runs of one key (the prefix cache's
// entries): a replay sets each one's addresses from the list run() is given.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace clefrt::cuda {

class GraphCache {
 public:
  struct Copy {  // a device-to-device copy whose addresses differ between runs of one key
    void* dst;
    const void* src;
    size_t bytes;
  };

  // after >= 2: a key is captured at its after-th sighting (the ones before ran eagerly to the
  // end, which is when the GEMMs tune themselves and cuDNN builds its plans). At most `max_execs`
  // executable graphs are held (the least recently used goes) and `max_keys` (> max_execs) keys
  // counted.
  //
  // A graph replays the kernels its capture chose: process-wide switches that pick kernels (the
  // labs' setters, e.g. gdn_wgmma_set_*, f32_gemm_3xtf32_set_tile) changed after a capture do not
  // reach its replays (tests that flip them open an engine per setting).
  explicit GraphCache(int64_t after, size_t max_execs = 16, size_t max_keys = 256);
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // Runs `work` on stream s: eagerly, or captured and launched, or replayed. True when a graph
  // ran it. A capture that fails is ended and the work runs eagerly: an error of the work's own
  // is thrown again there (and is not the capture's fault); otherwise the capture was at fault
  // (work did something capture cannot record): the reason is logged, the key is not captured
  // again, and after two such failures no key is (the graphs held are freed).
  // `copies`: what work() issues through copy(), in that order (the same count and sizes for
  // one key).
  bool run(const std::vector<int64_t>& key, cudaStream_t s, const std::function<void()>& work,
           const std::vector<Copy>& copies = {});
  // A copy of `copies`, issued by work() on s: an ordinary asynchronous copy, and while a capture
  // is under way the graph's node for it is noted (a replay sets its addresses).
  void copy(const Copy& c, cudaStream_t s);

  size_t held() const;                     // executable graphs held
  size_t replays() const { return replays_; }

 private:
  struct Entry {
    int64_t seen = 0;
    cudaGraph_t graph = nullptr;              // kept with exec when it has copies: their nodes are its
    std::vector<cudaGraphNode_t> copy_nodes;  // copy()'s nodes, in order
    cudaGraphExec_t exec = nullptr;
    uint64_t used = 0;
    bool refused = false;  // its capture failed: eager from now on
  };
  std::string capture(Entry& e, cudaStream_t s, const std::function<void()>& work, size_t copies);
  static void drop_exec(Entry& e);
  void refuse(Entry& e, const std::string& why);
  void evict_exec();
  void evict_key();

  int64_t after_;
  size_t max_execs_, max_keys_;
  std::map<std::vector<int64_t>, Entry> entries_;
  uint64_t clock_ = 0;
  size_t replays_ = 0;
  int failures_ = 0;
  bool capturing_ = false;
  std::vector<cudaGraphNode_t> noted_;  // copy()'s nodes in the capture under way
  std::string note_error_;              // why a copy's node could not be noted (the capture then fails)
};

}  // namespace clefrt::cuda
