// The prefix cache (issue: state reuse): per cached prefix of token ids, the state a request
// that starts with it continues from (model/prefix_state.h on the CPU), so it computes only the
// rest. Prefixes are cut at multiples of the backend's granularity (the CPU's chunk), found by a
// hash per boundary and confirmed id for id. A byte budget with least-recently-used eviction;
// an entry a running batch holds is not evicted. Thread-safe.
#pragma once
#include <clefrt/clefrt.h>

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace clefrt {

// A backend's state after a prefix.
struct CachedState {
  virtual ~CachedState() = default;
  virtual size_t bytes() const = 0;
};

struct PrefixEntry {
  std::vector<int32_t> ids;                  // the prefix
  std::shared_ptr<const CachedState> state;  // after it
  size_t bytes = 0;                          // state + ids
  uint64_t key = 0;                          // its boundary hash
};

class PrefixCache {
 public:
  PrefixCache(size_t budget_bytes, int64_t granularity);
  int64_t granularity() const { return granularity_; }

  // The longest cached prefix ids[0, n) with n <= limit (a multiple of the granularity), or null;
  // counted as a hit or a miss. The caller's copy keeps the entry from eviction while it runs.
  std::shared_ptr<const PrefixEntry> find(const int32_t* ids, int64_t limit);
  // Keeps the state after ids[0, n) (n a multiple of the granularity). Nothing when that prefix is
  // cached already or the state alone is over the budget; otherwise the least recently used
  // entries no one holds go until it fits.
  void insert(const int32_t* ids, int64_t n, std::shared_ptr<const CachedState> state);
  // Whether insert() could keep a state of `state_bytes` after ids[0, n): not cached yet and not
  // over the budget alone (asked before the state is copied out of a running request).
  bool would_keep(const int32_t* ids, int64_t n, size_t state_bytes) const;
  // Before a backend allocates a state of `state_bytes` after n ids (the GPU's entries are
  // device memory: freed here before the new one is taken): evicts the least recently used
  // entries no one holds until it would fit the budget, and says true; when even evicting all
  // of those would not make room, evicts nothing, counts it too_large and says false.
  bool make_room(int64_t n, size_t state_bytes);
  PrefixCacheStats stats() const;

 private:
  using Lru = std::list<std::shared_ptr<const PrefixEntry>>;  // front: most recently used
  void evict_until_fits_locked(size_t incoming);

  const size_t budget_;
  const int64_t granularity_;
  mutable std::mutex mu_;
  Lru lru_;
  std::unordered_map<uint64_t, Lru::iterator> by_key_;
  PrefixCacheStats stats_;
};

}  // namespace clefrt
