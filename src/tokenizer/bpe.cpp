// Byte-pair merging: repeatedly merge the adjacent pair with the lowest merge rank, leftmost
// first among equal ranks (the order HF's BPE::merge_word uses). A heap keeps long pieces
// (a 100 KB run of '=' is one piece) at O(n log n).
#include <queue>

#include "tokenizer/internal.h"

namespace clefrt::tok {

namespace {

struct Sym {
  int32_t id;
  int32_t prev, next;  // -1 at the ends
  bool dead;
};

struct Cand {
  int32_t rank;
  int32_t pos;  // index of the left symbol (its byte order in the piece)
  int32_t left, right, merged;
  bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void Bpe::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(byte_ids[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= kCacheMaxPiece;
  std::string key;
  if (cacheable) {
    key.assign(piece);
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  bool done = false;
  if (ignore_merges && vocab) {
    auto it = vocab->find(byte_level().map(piece));
    if (it != vocab->end()) {
      out.push_back(it->second);
      done = true;
    }
  }
  if (!done) {
    std::vector<Sym> syms(piece.size());
    for (size_t k = 0; k < piece.size(); ++k)
      syms[k] = {byte_ids[static_cast<unsigned char>(piece[k])], int32_t(k) - 1,
                 k + 1 < piece.size() ? int32_t(k + 1) : -1, false};
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto consider = [&](int32_t l) {
      if (l < 0) return;
      int32_t r = syms[l].next;
      if (r < 0) return;
      auto it = merges.find(pair_key(syms[l].id, syms[r].id));
      if (it != merges.end()) heap.push({it->second.first, l, syms[l].id, syms[r].id, it->second.second});
    };
    for (int32_t k = 0; k + 1 < int32_t(piece.size()); ++k) consider(k);
    while (!heap.empty()) {
      Cand c = heap.top();
      heap.pop();
      Sym& L = syms[c.pos];
      // Stale entries: the left symbol was merged away or changed, or its neighbour changed.
      if (L.dead || L.id != c.left || L.next < 0) continue;
      Sym& R = syms[L.next];
      if (R.id != c.right) continue;
      L.id = c.merged;
      R.dead = true;
      L.next = R.next;
      if (R.next >= 0) syms[R.next].prev = c.pos;
      consider(L.prev);
      consider(c.pos);
    }
    for (int32_t k = 0; k >= 0; k = syms[k].next) out.push_back(syms[k].id);
  }
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + std::ptrdiff_t(start), out.end());
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache.size() >= kCacheMax) cache.clear();
    cache.emplace(std::move(key), std::move(ids));
  }
}

}  // namespace clefrt::tok
