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

PrefixCache::PrefixCache(size_t budget_bytes, int64_t granularity, HostTier host)
    : budget_(budget_bytes), granularity_(granularity), host_(std::move(host)) {
  stats_.enabled = true;
  stats_.budget_bytes = budget_bytes;
  stats_.granularity = granularity;
  stats_.host_budget_bytes = host_.copy_out ? host_.budget_bytes : 0;
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
    const int64_t n = int64_t(i + 1) * granularity_;
    for (bool host : {false, true}) {  // the backend's own memory first
      auto& map = host ? host_by_key_ : by_key_;
      Lru& lru = host ? host_lru_ : lru_;
      auto it = map.find(keys[i]);
      if (it == map.end()) continue;
      const auto& e = *it->second;
      if (int64_t(e->ids.size()) != n || !std::equal(e->ids.begin(), e->ids.end(), ids)) continue;  // a hash collision
      lru.splice(lru.begin(), lru, it->second);
      ++stats_.hits;
      stats_.hit_tokens += uint64_t(n);
      if (host) {
        ++stats_.host_hits;
        stats_.host_hit_tokens += uint64_t(n);
      }
      return e;
    }
  }
  ++stats_.misses;
  return nullptr;
}

void PrefixCache::copy_back_failed(const PrefixEntry& e) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t n = e.ids.size();
  --stats_.hits;
  stats_.hit_tokens -= n;
  --stats_.host_hits;
  stats_.host_hit_tokens -= n;
  ++stats_.misses;
}

std::shared_ptr<const PrefixEntry> PrefixCache::insert(const int32_t* ids, int64_t n, std::shared_ptr<const CachedState> state) {
  if (n <= 0 || n % granularity_ != 0 || !state) return nullptr;
  auto e = std::make_shared<PrefixEntry>();
  e->ids.assign(ids, ids + n);
  e->bytes = state->bytes() + size_t(n) * sizeof(int32_t);
  e->state = std::move(state);
  const uint64_t key = e->key = key_of(ids, n);
  Victims evicted;  // copied to the host tier once the lock is released
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (e->bytes > budget_) {
      ++stats_.too_large;
      return nullptr;
    }
    auto it = by_key_.find(key);
    if (it != by_key_.end()) {
      if ((*it->second)->ids == e->ids) {
        lru_.splice(lru_.begin(), lru_, it->second);
        return *it->second;
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
      return nullptr;
    }
    evict_until_fits_locked(e->bytes, evicted);
    lru_.push_front(e);
    by_key_[key] = lru_.begin();
    stats_.bytes += e->bytes;
    ++stats_.entries;
    ++stats_.inserted;
  }
  to_host(evicted);
  return e;
}

void PrefixCache::evict_until_fits_locked(size_t incoming, Victims& evicted) {
  for (auto it = lru_.end(); it != lru_.begin() && stats_.bytes + incoming > budget_;) {
    --it;
    if (it->use_count() > 1) continue;  // a running batch holds it
    const auto& e = *it;
    if (host_.copy_out) evicted.push_back(e);
    by_key_.erase(e->key);
    stats_.bytes -= e->bytes;
    --stats_.entries;
    ++stats_.evictions;
    it = lru_.erase(it);
  }
}

// Entries the backend's budget evicted, into the host tier (without the cache's lock: the
// copies take a while): one already there (a prefix copied back earlier) only moves to the
// front; otherwise the backend copies the state out, then the host tier's least recently used
// entries no one holds go until the copy fits (or, when they cannot, the copy goes). The
// evicted states' own memory is freed when the caller's list of them goes.
void PrefixCache::to_host(const Victims& evicted) {
  for (const auto& e : evicted) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (e->bytes > host_.budget_bytes) continue;
      auto it = host_by_key_.find(e->key);
      if (it != host_by_key_.end() && (*it->second)->ids == e->ids) {
        host_lru_.splice(host_lru_.begin(), host_lru_, it->second);
        continue;
      }
    }
    std::shared_ptr<const CachedState> copy = host_.copy_out(*e->state);
    if (!copy) continue;
    auto c = std::make_shared<PrefixEntry>();
    c->ids = e->ids;
    c->bytes = copy->bytes() + e->ids.size() * sizeof(int32_t);
    c->state = std::move(copy);
    c->key = e->key;
    c->host = true;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = host_by_key_.find(c->key);
    if (it != host_by_key_.end()) {  // a colliding prefix: the newer one takes the key
      stats_.host_bytes -= (*it->second)->bytes;
      host_lru_.erase(it->second);
      host_by_key_.erase(it);
      --stats_.host_entries;
    }
    for (auto h = host_lru_.end(); h != host_lru_.begin() && stats_.host_bytes + c->bytes > host_.budget_bytes;) {
      --h;
      if (h->use_count() > 1) continue;  // a running batch is copying it back
      host_by_key_.erase((*h)->key);
      stats_.host_bytes -= (*h)->bytes;
      --stats_.host_entries;
      ++stats_.host_evictions;
      h = host_lru_.erase(h);
    }
    if (stats_.host_bytes + c->bytes > host_.budget_bytes) continue;  // the rest is held: the copy goes
    host_lru_.push_front(c);
    host_by_key_[c->key] = host_lru_.begin();
    stats_.host_bytes += c->bytes;
    ++stats_.host_entries;
    ++stats_.to_host;
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
  Victims evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t evictable = 0;  // as insert(): evict only when that makes room
    for (const auto& x : lru_)
      if (x.use_count() == 1) evictable += x->bytes;
    if (bytes > budget_ || stats_.bytes - evictable + bytes > budget_) {
      ++stats_.too_large;
      return false;
    }
    evict_until_fits_locked(bytes, evicted);
  }
  to_host(evicted);
  return true;
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace clefrt
