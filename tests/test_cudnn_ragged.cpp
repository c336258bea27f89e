// The host side of cuDNN's attention (cuda/runtime/cudnn_attention.h): the ragged arrays a
// packed batch hands the graph (element offsets through each tensor's row stride, the empty
// sequences up to the plan's bound starting where the last real one ends, each array 16-byte
// aligned) and the plans' bounds. The GPU side is checked on the GPU machine
// (CudaOps.CudnnAttentionMatchesCpuAndKeepsItsBits).
#include <gtest/gtest.h>

#ifdef CLEFRT_HAVE_CUDA
#include <vector>

#include "clefrt/clefrt.h"
#include "cuda/runtime/cudnn_attention.h"

namespace clefrt::cuda {
namespace {

TEST(CudnnRagged, OffsetsLengthsAndAlignment) {
  // two sequences: 5 queries over their own 5 keys, and 3 queries continuing 5 cached keys (key
  // rows 10..18); the plan's bound is 4 sequences
  const std::vector<RaggedSeq> seqs = {{0, 5, 0, 5}, {5, 3, 10, 8}};
  std::vector<int32_t> out = {7, 7, 7};  // what the batch's index arrays hold before
  const int64_t ldq = 6, ldk = 2, ldv = 7, ldo = 6, b = 4;
  const size_t at = append_ragged(out, seqs, b, ldq, ldk, ldv, ldo);
  EXPECT_EQ(at % 4, 0u) << "the block starts 16-byte aligned";
  EXPECT_LE(out.size() - 3, ragged_ints(b)) << "ragged_ints bounds what append_ragged adds (padding included)";
  const CudnnRagged r = ragged_at(out.data() + at, b);
  for (const int32_t* p : {r.q_off, r.k_off, r.v_off, r.o_off, r.seq_q, r.seq_kv})
    EXPECT_EQ((p - out.data()) % 4, 0) << "each array 16-byte aligned";
  const std::vector<int32_t> q = {0, 5 * 6, 8 * 6, 8 * 6, 8 * 6}, k = {0, 10 * 2, 18 * 2, 18 * 2, 18 * 2}, v = {0, 10 * 7, 18 * 7, 18 * 7, 18 * 7};
  for (int i = 0; i <= b; ++i) {
    EXPECT_EQ(r.q_off[i], q[size_t(i)]) << "q offset " << i;
    EXPECT_EQ(r.o_off[i], q[size_t(i)]) << "o offset " << i;
    EXPECT_EQ(r.k_off[i], k[size_t(i)]) << "k offset " << i;
    EXPECT_EQ(r.v_off[i], v[size_t(i)]) << "v offset " << i;
  }
  const std::vector<int32_t> sq = {5, 3, 0, 0}, skv = {5, 8, 0, 0};
  for (int i = 0; i < b; ++i) {
    EXPECT_EQ(r.seq_q[i], sq[size_t(i)]) << "queries of " << i;
    EXPECT_EQ(r.seq_kv[i], skv[size_t(i)]) << "keys of " << i;
  }
  EXPECT_EQ(out[0], 7) << "what was there stays";
}

TEST(CudnnRagged, AnOffsetPastInt32IsAnError) {
  std::vector<int32_t> out;
  EXPECT_THROW(append_ragged(out, {{int64_t(1) << 28, 1, 0, 1}}, 1, 16, 16, 16, 16), Error);
}

TEST(CudnnRagged, BoundsArePowersOfTwo) {
  EXPECT_EQ(cudnn_bound(0), 64);
  EXPECT_EQ(cudnn_bound(64), 64);
  EXPECT_EQ(cudnn_bound(65), 128);
  EXPECT_EQ(cudnn_bound(8192), 8192);
  EXPECT_EQ(cudnn_bound(1, 1), 1);
  EXPECT_EQ(cudnn_bound(3, 1), 4);
  EXPECT_EQ(cudnn_bound(33, 1), 64);
}

}  // namespace
}  // namespace clefrt::cuda
#endif
