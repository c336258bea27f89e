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

PrefixCache::PrefixCache(size_t budget_bytes, int64_t granularity, HostTier host) : granularity_(granularity), host_(std::move(host)) {
  stats_.enabled = true;
  stats_.budget_bytes = budget_bytes;
  stats_.granularity = granularity;
  own_.budget = budget_bytes;
  host_tier_.budget = host_.copy_out ? host_.budget_bytes : 0;
}

size_t PrefixCache::Tier::evictable() const {
  size_t b = 0;
  for (const auto& x : lru)
    if (x.use_count() == 1) b += x->bytes;
  return b;
}

void PrefixCache::Tier::push(std::shared_ptr<const PrefixEntry> e) {
  bytes += e->bytes;
  ++entries;
  const uint64_t key = e->key;
  lru.push_front(std::move(e));
  by_key[key] = lru.begin();
}

void PrefixCache::Tier::erase(Lru::iterator it) {
  by_key.erase((*it)->key);
  bytes -= (*it)->bytes;
  --entries;
  lru.erase(it);
}

void PrefixCache::Tier::evict_until_fits(size_t incoming, Victims* evicted) {
  for (auto it = lru.end(); it != lru.begin() && bytes + incoming > budget;) {
    --it;
    if (it->use_count() > 1) continue;  // a running batch holds it
    if (evicted) evicted->push_back(*it);
    ++evictions;
    const auto next = std::next(it);
    erase(it);
    it = next;
  }
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
    for (Tier* t : {&own_, &host_tier_}) {  // the backend's own memory first
      auto it = t->by_key.find(keys[i]);
      if (it == t->by_key.end()) continue;
      const auto& e = *it->second;
      if (int64_t(e->ids.size()) != n || !std::equal(e->ids.begin(), e->ids.end(), ids)) continue;  // a hash collision
      t->lru.splice(t->lru.begin(), t->lru, it->second);
      ++stats_.hits;
      stats_.hit_tokens += uint64_t(n);
      if (t == &host_tier_) {
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
  e->key = key_of(ids, n);
  Victims evicted;  // copied to the host tier once the lock is released
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (e->bytes > own_.budget) {
      ++stats_.too_large;
      return nullptr;
    }
    auto it = own_.by_key.find(e->key);
    if (it != own_.by_key.end()) {
      if ((*it->second)->ids == e->ids) {
        own_.lru.splice(own_.lru.begin(), own_.lru, it->second);
        return *it->second;
      }
      own_.erase(it->second);  // a colliding prefix: the newer one takes the key
    }
    // evict only when that makes room: entries running batches hold stay, and so then does the rest
    if (own_.bytes - own_.evictable() + e->bytes > own_.budget) {
      ++stats_.too_large;
      return nullptr;
    }
    own_.evict_until_fits(e->bytes, host_.copy_out ? &evicted : nullptr);
    own_.push(e);
    ++stats_.inserted;
  }
  to_host(evicted);
  return e;
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
      if (e->bytes > host_tier_.budget) continue;
      auto it = host_tier_.by_key.find(e->key);
      if (it != host_tier_.by_key.end() && (*it->second)->ids == e->ids) {
        host_tier_.lru.splice(host_tier_.lru.begin(), host_tier_.lru, it->second);
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
    auto it = host_tier_.by_key.find(c->key);
    if (it != host_tier_.by_key.end()) host_tier_.erase(it->second);  // a colliding prefix: the newer one takes the key
    host_tier_.evict_until_fits(c->bytes, nullptr);
    if (host_tier_.bytes + c->bytes > host_tier_.budget) continue;  // the rest is held: the copy goes
    host_tier_.push(std::move(c));
    ++stats_.to_host;
  }
}

bool PrefixCache::would_keep(const int32_t* ids, int64_t n, size_t state_bytes) const {
  if (n <= 0 || n % granularity_ != 0) return false;
  const size_t bytes = state_bytes + size_t(n) * sizeof(int32_t);
  const uint64_t key = key_of(ids, n);
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > own_.budget) return false;
  auto it = own_.by_key.find(key);
  return it == own_.by_key.end() || !std::equal((*it->second)->ids.begin(), (*it->second)->ids.end(), ids);
}

bool PrefixCache::make_room(int64_t n, size_t state_bytes) {
  const size_t bytes = state_bytes + size_t(std::max<int64_t>(n, 0)) * sizeof(int32_t);
  Victims evicted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // as insert(): evict only when that makes room
    if (bytes > own_.budget || own_.bytes - own_.evictable() + bytes > own_.budget) {
      ++stats_.too_large;
      return false;
    }
    own_.evict_until_fits(bytes, host_.copy_out ? &evicted : nullptr);
  }
  to_host(evicted);
  return true;
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PrefixCacheStats s = stats_;
  s.bytes = own_.bytes;
  s.entries = own_.entries;
  s.evictions = own_.evictions;
  s.host_budget_bytes = host_tier_.budget;
  s.host_bytes = host_tier_.bytes;
  s.host_entries = host_tier_.entries;
  s.host_evictions = host_tier_.evictions;
  return s;
}

}  // namespace clefrt
