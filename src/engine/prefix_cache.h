// The prefix cache (issue: state reuse): per cached prefix of token ids, the state a request
// that starts with it continues from (model/prefix_state.h on the CPU), so it computes only the
// rest. Prefixes are cut at multiples of the backend's granularity (the CPU's chunk), found by a
// hash per boundary and confirmed id for id. A byte budget with least-recently-used eviction;
// an entry a running batch holds is not evicted. Optionally a host tier with a budget of its own
// (the GPU's prefixes in pinned host memory): what the GPU's budget evicts is copied there
// instead of dropped, and a hit there is copied back by the backend (the same bits). Thread-safe.
#pragma once
#include <clefrt/clefrt.h>

#include <cstdint>
#include <functional>
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
  bool host = false;                         // state is the host tier's copy (HostTier::copy_out's)
};

// The host tier: its budget and how an evicted state is copied into it (null: it could not be,
// and the entry goes). Called on the thread that evicts (insert, make_room), without the
// cache's lock.
struct HostTier {
  size_t budget_bytes = 0;
  std::function<std::shared_ptr<const CachedState>(const CachedState&)> copy_out;
};

class PrefixCache {
 public:
  PrefixCache(size_t budget_bytes, int64_t granularity, HostTier host = {});
  int64_t granularity() const { return granularity_; }

  // The longest cached prefix ids[0, n) with n <= limit (a multiple of the granularity), in
  // either tier, or null; counted as a hit or a miss. The caller's copy keeps the entry from
  // eviction while it runs. A host-tier entry (host) is the backend's to copy back (make_room +
  // insert) or, when it cannot, to report with copy_back_failed().
  std::shared_ptr<const PrefixEntry> find(const int32_t* ids, int64_t limit);
  // A host-tier hit the backend could not copy back: counted as a miss after all.
  void copy_back_failed(const PrefixEntry& e);
  // Keeps the state after ids[0, n) (n a multiple of the granularity). Nothing when that prefix is
  // cached already or the state alone is over the budget; otherwise the least recently used
  // entries no one holds go until it fits.
  // Returns the entry kept (or the one already there), null when none is.
  std::shared_ptr<const PrefixEntry> insert(const int32_t* ids, int64_t n, std::shared_ptr<const CachedState> state);
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
  using Victims = std::vector<std::shared_ptr<const PrefixEntry>>;
  // One tier's entries and counters: the backend's own memory (own_) or the host tier (host_tier_).
  struct Tier {
    size_t budget = 0;
    Lru lru;
    std::unordered_map<uint64_t, Lru::iterator> by_key;
    size_t bytes = 0, entries = 0;
    uint64_t evictions = 0;
    size_t evictable() const;  // the bytes of entries no one holds
    void push(std::shared_ptr<const PrefixEntry> e);
    void erase(Lru::iterator it);
    // Evicts the least recently used entries no one holds until `incoming` more bytes fit (or
    // none is left to go), each into `evicted` when given.
    void evict_until_fits(size_t incoming, Victims* evicted);
  };
  void to_host(const Victims& evicted);

  const int64_t granularity_;
  const HostTier host_;
  mutable std::mutex mu_;
  Tier own_, host_tier_;
  PrefixCacheStats stats_;  // the lookup counters (the tiers hold their own)
};

}  // namespace clefrt
