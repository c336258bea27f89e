// What the rest of a sequence reads of its first tokens (spec/model.md 5): the backbone's state
// after them and the joint head's memory rows over them. The CPU forward carries a
// BackboneState from chunk to chunk; the prefix cache keeps a PrefixState per cached prefix,
// so a request that starts with one computes only what follows it, with the same bits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace clefrt::model {

struct BackboneState {
  int64_t length = 0;  // tokens read so far (the position of the next one)
  // Per layer (by index; empty for the other layer type):
  std::vector<std::vector<float>> k, v;  // full attention: keys after k_norm + RoPE and values, [length, kv_heads * head_dim]
  std::vector<std::vector<float>> gdn;   // GDN: the recurrent state per value head, [v_heads, k_head_dim, v_head_dim]
  std::vector<std::vector<float>> conv;  // GDN: the last conv_kernel - 1 in_proj_qkv rows, [conv_kernel - 1, conv_dim] (zeros at the start)

  static BackboneState start(const TextConfig& c);  // before the first token
  // Room for the K/V of `tokens` tokens, grown geometrically (a request run in steps must not
  // copy its K/V at every step).
  void reserve(const TextConfig& c, int64_t tokens);
  size_t bytes() const;
};

struct PrefixState {
  BackboneState backbone;
  std::vector<float> memory;  // the joint head's memory M over the prefix rows, [backbone.length, width]
  size_t bytes() const { return backbone.bytes() + memory.size() * sizeof(float); }
};

}  // namespace clefrt::model
