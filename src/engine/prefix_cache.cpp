#include "engine/prefix_cache.h"

#include <algorithm>

namespace clefrt {

namespace {

uint64_t mix(uint64_t h, uint64_t x) {  // splitmix64 over the running hash and the next id
  h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

// The boundary hash of ids[0, n): every id folded in, then the length (find() folds the same
// way, keeping each boundary's value on the way).
uint64_t key_of(const int32_t* ids, int64_t n) {
  uint64_t h = 0;
  for (int64_t t = 0; t < n; ++t) h = mix(h, uint32_t(ids[t]));
  return mix(h, uint64_t(n));
}

}  // namespace

PrefixCache::PrefixCache(size_t budget_bytes, int64_t granularity) : budget_(budget_bytes), granularity_(granularity) {
  stats_.enabled = true;
  stats_.budget_bytes = budget_bytes;
  stats_.granularity = granularity;
}

std::shared_ptr<const PrefixEntry> PrefixCache::find(const int32_t* ids, int64_t limit) {
  limit = limit / granularity_ * granularity_;
  if (limit <= 0) return nullptr;
  // the boundary hashes, longest first; each is the hash of the whole prefix
  std::vector<uint64_t> keys;
  {
    uint64_t h = 0;
    for (int64_t n = granularity_; n <= limit; n += granularity_) {
      for (int64_t t = n - granularity_; t < n; ++t) h = mix(h, uint32_t(ids[t]));
      keys.push_back(mix(h, uint64_t(n)));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = keys.size(); i-- > 0;) {
    auto it = by_key_.find(keys[i]);
    if (it == by_key_.end()) continue;
    const auto& e = *it->second;
    const int64_t n = int64_t(i + 1) * granularity_;
    if (int64_t(e->ids.size()) != n || !std::equal(e->ids.begin(), e->ids.end(), ids)) continue;  // a hash collision
    lru_.splice(lru_.begin(), lru_, it->second);
    ++stats_.hits;
    stats_.hit_tokens += uint64_t(n);
    return e;
  }
  ++stats_.misses;
  return nullptr;
}

void PrefixCache::insert(const int32_t* ids, int64_t n, std::shared_ptr<const CachedState> state) {
  if (n <= 0 || n % granularity_ != 0 || !state) return;
  auto e = std::make_shared<PrefixEntry>();
  e->ids.assign(ids, ids + n);
  e->bytes = state->bytes() + size_t(n) * sizeof(int32_t);
  e->state = std::move(state);
  const uint64_t key = e->key = key_of(ids, n);
  std::lock_guard<std::mutex> lock(mu_);
  if (e->bytes > budget_) {
    ++stats_.too_large;
    return;
  }
  auto it = by_key_.find(key);
  if (it != by_key_.end()) {
    if ((*it->second)->ids == e->ids) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return;
    }
    stats_.bytes -= (*it->second)->bytes;  // a colliding prefix: the newer one takes the key
    lru_.erase(it->second);
    by_key_.erase(it);
    --stats_.entries;
  }
  // evict only when that makes room: entries running batches hold stay, and so then does the rest
  size_t evictable = 0;
  for (const auto& x : lru_)
    if (x.use_count() == 1) evictable += x->bytes;
  if (stats_.bytes - evictable + e->bytes > budget_) {
    ++stats_.too_large;
    return;
  }
  evict_until_fits_locked(e->bytes);
  lru_.push_front(e);
  by_key_[key] = lru_.begin();
  stats_.bytes += e->bytes;
  ++stats_.entries;
  ++stats_.inserted;
}

void PrefixCache::evict_until_fits_locked(size_t incoming) {
  for (auto it = lru_.end(); it != lru_.begin() && stats_.bytes + incoming > budget_;) {
    --it;
    if (it->use_count() > 1) continue;  // a running batch holds it
    const auto& e = *it;
    by_key_.erase(e->key);
    stats_.bytes -= e->bytes;
    --stats_.entries;
    ++stats_.evictions;
    it = lru_.erase(it);
  }
}

bool PrefixCache::would_keep(const int32_t* ids, int64_t n, size_t state_bytes) const {
  if (n <= 0 || n % granularity_ != 0) return false;
  const size_t bytes = state_bytes + size_t(n) * sizeof(int32_t);
  const uint64_t key = key_of(ids, n);
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > budget_) return false;
  auto it = by_key_.find(key);
  return it == by_key_.end() || !std::equal((*it->second)->ids.begin(), (*it->second)->ids.end(), ids);
}

bool PrefixCache::make_room(int64_t n, size_t state_bytes) {
  const size_t bytes = state_bytes + size_t(std::max<int64_t>(n, 0)) * sizeof(int32_t);
  std::lock_guard<std::mutex> lock(mu_);
  size_t evictable = 0;  // as insert(): evict only when that makes room
  for (const auto& x : lru_)
    if (x.use_count() == 1) evictable += x->bytes;
  if (bytes > budget_ || stats_.bytes - evictable + bytes > budget_) {
    ++stats_.too_large;
    return false;
  }
  evict_until_fits_locked(bytes);
  return true;
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace clefrt
