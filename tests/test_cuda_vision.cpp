// The GPU vision tower against the CPU oracle (model/vision.cpp): its bidirectional attention
// kernel at several head dims and frame sizes, the whole tower on the tiny-v fixture and at the
// 27B tower's shapes, packed images vs each alone, and images through the GPU engine against the
// CPU engine in fp32 on a well-conditioned model (issue 19's 2e-3 bound) and against the
// reference's fixture.
#include <cstring>
#include <optional>
#include <random>

#include "cpu/ops.h"
#include "cuda/model/vision_tower.h"
#include "image/preprocess.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"
#include "schema/images.h"
#include "model/config.h"
#include "model/synth.h"
#include "model/vision.h"
#include "model/weights.h"
#include "test_cuda_util.h"

namespace clefrt {
namespace {

using test::worst_diff;

template <class T>
cuda::DeviceBuffer up(const std::vector<T>& v) {
  cuda::DeviceBuffer b(std::max<size_t>(v.size(), 1) * sizeof(T), "test upload");
  cuda::check(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "test upload");
  return b;
}

float bf_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

// The rotary's packed-heads form (a warp per row, 8- and 16-byte accesses: Dp == hd) writes the
// bits of the per-row kernel's padded layout (Dp = hd + 8) in each head's first hd dims, at the
// 27B tower's heads (16 x 72) and at hd 16; rows offset by r0 as the tower's row blocks are. The
// in-place form gives the packed form's q and k bits within the qkv rows and leaves v.
TEST(CudaVision, PackedRopeEqualsPaddedRope) {
  NEED_GPU();
  for (auto [heads, hd] : {std::pair{16, 72}, {2, 16}, {3, 8}}) {
    const int n = 37, r0 = 5, S = r0 + n, H = heads * hd, half = hd / 2;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    std::vector<cuda::bf16> qkv(size_t(n) * 3 * H);
    for (auto& x : qkv) x = __float2bfloat16(nd(rng));
    std::vector<int32_t> rc(size_t(2 * S));
    for (int i = 0; i < S; ++i) rc[size_t(i)] = i / 7, rc[size_t(S + i)] = i % 7;
    std::vector<float> inv(size_t(half / 2));
    for (int j = 0; j < half / 2; ++j) inv[size_t(j)] = std::pow(10000.0f, -float(2 * j) / float(half));
    auto dqkv = up(qkv), drc = up(rc), dinv = up(inv);
    const int Dp = hd + 8;
    cuda::DeviceBuffer pq(size_t(S) * H * 2), pk(size_t(S) * H * 2), pv(size_t(S) * H * 2);
    cuda::DeviceBuffer wq(size_t(S) * heads * Dp * 2), wk(size_t(S) * heads * Dp * 2), wv(size_t(S) * heads * Dp * 2);
    const int32_t* row = drc.as<int32_t>();
    const int32_t* col = row + S;
    cuda::vision_qkv_rope(dqkv.as<cuda::bf16>(), n, r0, row, col, dinv.as<float>(), heads, hd, hd, pq.as<cuda::bf16>(), pk.as<cuda::bf16>(),
                          pv.as<cuda::bf16>(), nullptr);
    cuda::vision_qkv_rope(dqkv.as<cuda::bf16>(), n, r0, row, col, dinv.as<float>(), heads, hd, Dp, wq.as<cuda::bf16>(), wk.as<cuda::bf16>(),
                          wv.as<cuda::bf16>(), nullptr);
    cuda::check(cudaDeviceSynchronize(), "rope");
    for (auto [packed, padded, what] : {std::tuple{&pq, &wq, "q"}, {&pk, &wk, "k"}, {&pv, &wv, "v"}}) {
      std::vector<uint16_t> a(size_t(S) * H), b(size_t(S) * heads * Dp);
      cuda::check(cudaMemcpy(a.data(), packed->get(), a.size() * 2, cudaMemcpyDeviceToHost), "down");
      cuda::check(cudaMemcpy(b.data(), padded->get(), b.size() * 2, cudaMemcpyDeviceToHost), "down");
      size_t differ = 0;
      for (int r = r0; r < S; ++r)
        for (int h = 0; h < heads; ++h)
          for (int d = 0; d < hd; ++d) differ += a[size_t((r * heads + h) * hd + d)] != b[size_t((r * heads + h) * Dp + d)];
      EXPECT_EQ(differ, 0u) << what << " at heads " << heads << " x " << hd;
    }
    // in place (the tower's fused layout): q and k as the packed form writes them, v untouched
    cuda::DeviceBuffer ip(qkv.size() * 2);
    cuda::check(cudaMemcpy(ip.get(), dqkv.get(), qkv.size() * 2, cudaMemcpyDeviceToDevice), "copy");
    cuda::vision_qkv_rope_inplace(ip.as<cuda::bf16>(), n, r0, row, col, dinv.as<float>(), heads, hd, nullptr);
    cuda::check(cudaDeviceSynchronize(), "rope in place");
    std::vector<uint16_t> got(qkv.size()), pqh(size_t(S) * H), pkh(size_t(S) * H);
    cuda::check(cudaMemcpy(got.data(), ip.get(), got.size() * 2, cudaMemcpyDeviceToHost), "down");
    cuda::check(cudaMemcpy(pqh.data(), pq.get(), pqh.size() * 2, cudaMemcpyDeviceToHost), "down");
    cuda::check(cudaMemcpy(pkh.data(), pk.get(), pkh.size() * 2, cudaMemcpyDeviceToHost), "down");
    size_t differ = 0;
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < H; ++i) {
        const size_t at = size_t(r) * 3 * H;
        differ += got[at + size_t(i)] != pqh[size_t(r0 + r) * H + size_t(i)];
        differ += got[at + size_t(H + i)] != pkh[size_t(r0 + r) * H + size_t(i)];
        uint16_t v0;
        std::memcpy(&v0, &qkv[at + size_t(2 * H + i)], 2);
        differ += got[at + size_t(2 * H + i)] != v0;
      }
    EXPECT_EQ(differ, 0u) << "in place at heads " << heads << " x " << hd;
  }
}

// flash_attention_full against cpu::attention_full per frame, on bf16-rounded inputs.
TEST(CudaVision, FullAttentionAgainstCpu) {
  NEED_GPU();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t hd : {16, 32, 72}) {
    const int64_t heads = 3, H = heads * hd, Dp = cuda::flash_attention_full_padded(hd);
    ASSERT_GT(Dp, 0);
    const std::vector<int64_t> frames = {7, 64, 100, 300, 1, 777};  // 777: 7 key tiles of 128
    int64_t L = 0;
    for (int64_t f : frames) L += f;
    std::vector<float> q(size_t(L * H)), k(q.size()), v(q.size());
    for (auto* a : {&q, &k, &v})
      for (auto& x : *a) x = bf_round(nd(rng) * 1.5f);
    std::vector<cuda::bf16> qp(size_t(L * heads * Dp)), kp(qp.size()), vp(qp.size());
    for (int64_t t = 0; t < L; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < Dp; ++d) {
          const size_t o = size_t((t * heads + h) * Dp + d), i = size_t(t * H + h * hd + d);
          qp[o] = __float2bfloat16(d < hd ? q[i] : 0.0f);
          kp[o] = __float2bfloat16(d < hd ? k[i] : 0.0f);
          vp[o] = __float2bfloat16(d < hd ? v[i] : 0.0f);
        }
    std::vector<int32_t> tq, ts, te;
    std::vector<float> want(size_t(L * H));
    int64_t f0 = 0;
    for (int64_t f : frames) {
      for (int64_t t = f0; t < f0 + f; t += cuda::flash_attention_full_tile()) {
        tq.push_back(int32_t(t));
        ts.push_back(int32_t(f0));
        te.push_back(int32_t(f0 + f));
      }
      cpu::attention_full(q.data() + f0 * H, f, k.data() + f0 * H, v.data() + f0 * H, f, H, heads, want.data() + f0 * H);
      f0 += f;
    }
    std::vector<int32_t> tiles = tq;
    tiles.insert(tiles.end(), ts.begin(), ts.end());
    tiles.insert(tiles.end(), te.begin(), te.end());
    auto dq = up(qp), dk = up(kp), dv = up(vp);
    auto dt = up(tiles);
    cuda::DeviceBuffer out(size_t(L * H) * 2, "out");
    const int64_t n = int64_t(tq.size());
    const cuda::AttnTiles at{dt.as<int32_t>(), dt.as<int32_t>() + n, dt.as<int32_t>() + 2 * n, n};
    cuda::flash_attention_full(dq.as<cuda::bf16>(), dk.as<cuda::bf16>(), dv.as<cuda::bf16>(), heads, hd, at, out.as<cuda::bf16>(), nullptr);
    const auto got = test::down_bf(out, size_t(L * H));
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - want[i])));
    std::cout << "[ cuda    ] full attention, head dim " << hd << " (padded " << Dp << "): worst |o_gpu - o_cpu| = " << worst << "\n";
    EXPECT_LT(worst, 2e-2) << "head dim " << hd;  // bf16 P and output rounding on O(1) values
    // over its own queries (the tower's form): each query's padded row holds the same bits
    cuda::flash_attention_full(dq.as<cuda::bf16>(), dk.as<cuda::bf16>(), dv.as<cuda::bf16>(), heads, hd, at, dq.as<cuda::bf16>(), nullptr);
    std::vector<cuda::bf16> over(qp.size());
    cuda::check(cudaMemcpy(over.data(), dq.get(), over.size() * 2, cudaMemcpyDeviceToHost), "download");
    std::vector<cuda::bf16> packed(size_t(L * H));
    cuda::check(cudaMemcpy(packed.data(), out.get(), packed.size() * 2, cudaMemcpyDeviceToHost), "download");
    size_t differ = 0;
    for (int64_t t = 0; t < L; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < Dp; ++d) {
          const uint16_t a = reinterpret_cast<const uint16_t&>(over[size_t((t * heads + h) * Dp + d)]);
          const uint16_t b = d < hd ? reinterpret_cast<const uint16_t&>(packed[size_t(t * H + h * hd + d)]) : 0;
          differ += a != b;  // the padding dims stay zero
        }
    EXPECT_EQ(differ, 0u) << "head dim " << hd << ": output over the queries differs from the packed output";
    // and packed back as proj reads it: the packed output's bits
    cuda::DeviceBuffer repacked(size_t(L * H) * 2, "repacked");
    cuda::vision_pack_heads(dq.as<cuda::bf16>(), L * heads, hd, Dp, repacked.as<cuda::bf16>(), nullptr);
    std::vector<cuda::bf16> rp(size_t(L * H));
    cuda::check(cudaMemcpy(rp.data(), repacked.get(), rp.size() * 2, cudaMemcpyDeviceToHost), "download");
    EXPECT_EQ(std::memcmp(rp.data(), packed.data(), rp.size() * 2), 0) << "head dim " << hd << ": vision_pack_heads";
  }
}

// The GPU's cut of a resized image into patch rows (vision_patchify) against the processor's
// fp32 pixels rounded to bf16, bit for bit, on corpus images of several sizes and shapes.
TEST(CudaVision, PatchifyEqualsTheProcessorsPixels) {
  NEED_GPU();
  const VisionGeometry g;
  for (const char* name : {"rgb-333x500.png", "jpeg-420-640x480.jpg", "rgb-15x2000.png", "webp-lossy-320x240.webp"}) {
    ImageInput in;
    in.bytes = test::read_file(test::source_path(std::string("tests/fixtures/images/corpus/") + name));
    in.format = *sniff_image(in.bytes);
    const model::ImagePatches full = preprocess_image(in, g, g.max_pixels, "images[0]");
    const model::ImagePatches rgb = preprocess_image(in, g, g.max_pixels, "images[0]", true);
    ASSERT_EQ(rgb.grid_h, full.grid_h);
    ASSERT_EQ(rgb.grid_w, full.grid_w);
    ASSERT_TRUE(rgb.pixels.empty());
    const int64_t rows = full.grid_h * full.grid_w, cols = int64_t(full.pixels.size()) / rows;
    auto d_rgb = up(rgb.rgb);
    cuda::DeviceBuffer out(full.pixels.size() * 2, "patches");
    // in two slices, as the tower's row blocks cut it
    const int64_t half = rows / 2;
    cuda::vision_patchify(d_rgb.as<uint8_t>(), rgb.grid_w * g.patch_size, rgb.grid_w, g.merge_size, g.patch_size, g.temporal_patch_size, 0,
                          half, out.as<cuda::bf16>(), nullptr);
    cuda::vision_patchify(d_rgb.as<uint8_t>(), rgb.grid_w * g.patch_size, rgb.grid_w, g.merge_size, g.patch_size, g.temporal_patch_size,
                          half, rows - half, out.as<cuda::bf16>() + half * cols, nullptr);
    const auto got = test::down<cuda::bf16>(out, full.pixels.size());
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += __bfloat16_as_ushort(got[i]) != io::f32_to_bf16(full.pixels[i]);
    EXPECT_EQ(bad, 0u) << name;
  }
}

// A tower with random weights in memory (LoadMode::Full tensors), scaled as `clefrt synth` does.
model::VisionWeights random_vision(const model::VisionConfig& c, uint64_t seed) {
  model::VisionWeights w = model::shape_only_vision(c);
  std::mt19937_64 rng(seed);
  auto fill = [&](model::Tensor& t, float mean, float std) {
    std::normal_distribution<float> nd(mean, std);
    t.v.resize(size_t(t.numel()));
    for (float& x : t.v) x = nd(rng);
  };
  auto lin = [&](model::Tensor& t) { fill(t, 0.0f, 1.0f / std::sqrt(float(t.numel() / t.shape.front()))); };
  auto ln = [&](model::LayerNormW& n) {
    fill(n.w, 1.0f, 0.1f);
    fill(n.b, 0.0f, 0.1f);
  };
  lin(w.patch_w);
  fill(w.patch_b, 0.0f, 0.1f);
  fill(w.pos_embed, 0.0f, 0.5f);
  for (auto& b : w.blocks) {
    ln(b.norm1);
    ln(b.norm2);
    for (model::Tensor* t : {&b.qkv_w, &b.proj_w, &b.fc1_w, &b.fc2_w}) lin(*t);
    for (model::Tensor* t : {&b.qkv_b, &b.proj_b, &b.fc1_b, &b.fc2_b}) fill(*t, 0.0f, 0.1f);
  }
  ln(w.merger_norm);
  lin(w.merger_fc1_w);
  lin(w.merger_fc2_w);
  fill(w.merger_fc1_b, 0.0f, 0.1f);
  fill(w.merger_fc2_b, 0.0f, 0.1f);
  return w;
}

model::ImagePatches random_patches(const model::VisionConfig& c, int64_t gh, int64_t gw, uint64_t seed) {
  model::ImagePatches p;
  p.grid_h = gh;
  p.grid_w = gw;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  p.pixels.resize(size_t(gh * gw * c.in_channels * c.temporal_patch * c.patch * c.patch));
  for (float& x : p.pixels) x = u(rng);
  return p;
}

// The tower on the GPU vs model::vision_forward (fp32) for images of several grids, and the
// images packed into one call vs each alone (bit for bit).
void check_tower(const model::VisionConfig& vc, const model::VisionWeights& vw, const std::vector<std::pair<int64_t, int64_t>>& grids,
                 double bound, const std::string& name) {
  // build_device_model uploads the tower beside a tiny random text model, which this test
  // does not run
  const model::ModelConfig tiny = model::synthetic_config("tiny");
  cuda::DevModel dm = cuda::build_device_model(model::shape_only_text(tiny.text), model::shape_only_head(tiny.head), tiny.text, tiny.head,
                                               {}, &vw, &vc);
  ASSERT_TRUE(dm.has_vision);
  {  // the biases the residual leaves out, summed before each LayerNorm: the host's fp32 sums in
     // the same order, bit for bit
    auto host = [](const model::Tensor& t) { return t.v.empty() ? model::to_f32(*t.src) : t.v; };
    const int64_t H = vc.hidden;
    ASSERT_EQ(dm.vision.bias_before.size(), 2 * vw.blocks.size() + 1);
    EXPECT_EQ(dm.vision.bias_before[0], nullptr);
    std::vector<float> run(static_cast<size_t>(H), 0.0f), got(static_cast<size_t>(H));
    for (size_t l = 0; l < vw.blocks.size(); ++l) {
      const std::vector<float> pb = host(vw.blocks[l].proj_b), fb = host(vw.blocks[l].fc2_b);
      for (int64_t i = 0; i < H; ++i) run[size_t(i)] = l ? run[size_t(i)] + pb[size_t(i)] : pb[size_t(i)];
      cuda::check(cudaMemcpy(got.data(), dm.vision.bias_before[2 * l + 1], size_t(H) * 4, cudaMemcpyDeviceToHost), "down");
      EXPECT_EQ(got, run) << name << ": the bias sum before block " << l << "'s norm2";
      for (int64_t i = 0; i < H; ++i) run[size_t(i)] += fb[size_t(i)];
      cuda::check(cudaMemcpy(got.data(), dm.vision.bias_before[2 * l + 2], size_t(H) * 4, cudaMemcpyDeviceToHost), "down");
      EXPECT_EQ(got, run) << name << ": the bias sum after block " << l;
    }
  }
  std::vector<model::ImagePatches> ims;
  int64_t S = 0, T = 0;
  for (size_t i = 0; i < grids.size(); ++i) {
    ims.push_back(random_patches(vc, grids[i].first, grids[i].second, 100 + i));
    S += grids[i].first * grids[i].second;
  }
  T = S / 4;
  cudaStream_t st;
  cuda::check(cudaStreamCreate(&st), "stream");
  {
    cuda::Gemm gemm(st, true);
    cuda::Arena plan = cuda::Arena::counter();
    cuda::VisionScratch::carve(plan, vc, S);
    cuda::Arena arena;
    arena.reserve(plan.used() + (1 << 20));
    const cuda::VisionScratch s = cuda::VisionScratch::carve(arena, vc, S);
    cuda::DeviceBuffer out(size_t(T * vc.out_hidden) * 4, "tower out");
    std::vector<const model::ImagePatches*> all;
    for (const auto& p : ims) all.push_back(&p);
    std::vector<std::vector<float>> want;
    for (const auto& p : ims) want.push_back(model::vision_forward(vw, vc, p));
    // clefrt's flash kernel (what every GPU without cuDNN runs), cuDNN's where it loads (what the
    // engine runs under --attention auto)
    std::string why;
    std::unique_ptr<cuda::CudnnFrameAttention> cudnn;
    if (cuda::cudnn_available(&why)) cudnn = cuda::tower_attention(vc);
    else std::cout << "[ cuda    ] vision tower " << name << ": cuDNN not available (" << why << "), clefrt's attention only\n";
    std::vector<cuda::CudnnFrameAttention*> kernels = {nullptr};
    if (cudnn) kernels.push_back(cudnn.get());
    for (cuda::CudnnFrameAttention* att : kernels) {
      const std::string kind = att ? "cuDNN attention" : "clefrt flash attention";
      cuda::vision_tower(dm.vision, gemm, all, s, out.as<float>(), st, [](const char*) {}, att);
      const auto packed = test::down<float>(out, size_t(T * vc.out_hidden));
      int64_t row = 0;
      double worst_rel = 0;
      for (size_t i = 0; i < ims.size(); ++i) {
        cuda::vision_tower(dm.vision, gemm, {&ims[i]}, s, out.as<float>(), st, [](const char*) {}, att);
        const auto alone = test::down<float>(out, want[i].size());
        double scale = 0, diff = 0;
        bool same = true;
        for (size_t k = 0; k < want[i].size(); ++k) {
          scale = std::max(scale, double(std::fabs(want[i][k])));
          diff = std::max(diff, double(std::fabs(alone[k] - want[i][k])));
          same &= alone[k] == packed[size_t(row * vc.out_hidden) + k];
        }
        EXPECT_TRUE(same) << name << " (" << kind << ") image " << i << ": packed with the others vs alone";
        worst_rel = std::max(worst_rel, diff / scale);
        row += int64_t(want[i].size()) / vc.out_hidden;
      }
      std::cout << "[ cuda    ] vision tower " << name << " (" << kind << "), " << ims.size() << " images (" << S
                << " patches): max |rows_gpu - rows_cpu32| / max |rows_cpu32| = " << worst_rel << "\n";
      EXPECT_LT(worst_rel, bound) << name << " (" << kind << ")";
    }
  }
  cudaStreamDestroy(st);
}

TEST(CudaVision, TowerOnTinyVAgainstCpuFp32) {
  NEED_GPU();
  const std::string dir = test::source_path("tests/fixtures/oracle/tiny-v");
  const model::ModelConfig cfg = model::load_config(dir);
  io::TensorStore store = io::TensorStore::open_folder(dir);
  const model::VisionWeights vw = model::load_vision_weights(store, cfg.vision);
  check_tower(cfg.vision, vw, {{4, 4}, {8, 6}, {2, 16}, {32, 24}}, 2e-2, "tiny-v");
}

// The 27B tower's widths (hidden 1152, 16 heads of 72, ffn 4304, out 5120), two blocks of random
// weights; one 1024 x 768 image's grid (48 x 64 = 3,072 patches) among smaller ones.
TEST(CudaVision, TowerAt27bShapesAgainstCpuFp32) {
  NEED_GPU();
  model::VisionConfig vc;
  vc.present = true;
  vc.depth = 2;
  vc.hidden = 1152;
  vc.heads = 16;
  vc.ffn = 4304;
  vc.out_hidden = 5120;
  vc.num_position_embeddings = 2304;
  const model::VisionWeights vw = random_vision(vc, 11);
  // the 3,072-patch frame (cuDNN's dense plan) after another image: its pointers at a row offset
  check_tower(vc, vw, {{6, 10}, {48, 64}, {16, 16}}, 2e-2, "27B shapes (2 blocks)");
  // past one row block (4,096 patches): the qkv rows and the rotary of a later block, the large
  // image at row 256 packed and at row 0 alone
  check_tower(vc, vw, {{16, 16}, {64, 72}}, 2e-2, "27B shapes, 4,864 patches (2 blocks)");
}

// Images through the GPU engine (prepare: decode + processor; the forward: the tower with the
// batch's other images, then the backbone with mRoPE rows) vs the CPU engine in fp32, on the
// `small` preset with Linear gain 0.5 (the well-conditioned model of
// CudaEngine.WellConditionedAgainstCpuFp32), with the tiny-v fixture's 24 requests (21 with
// 1-4 images); then a batch of all of them vs each alone.
TEST(CudaVision, ImagesThroughTheEngineAgainstCpuFp32) {
  NEED_GPU();
  const std::string dir = test::synth_folder("calm-small-v", 5, "small", 0.5f);
  EngineOptions co;
  co.device = Device::Cpu;
  EngineOptions go;
  go.device = Device::Cuda;
  auto cpu = Engine::load(dir, co);
  auto gpu = Engine::load(dir, go);
  std::istringstream in(test::read_file(test::source_path("tests/fixtures/oracle/tiny-v.expected.jsonl")));
  std::vector<Prepared> pc, pg;
  size_t with_images = 0;
  for (std::string line; std::getline(in, line);) {
    const json::Value rec = json::parse(line);
    const std::string req = json::write(*rec.find("request"));
    pc.push_back(cpu->prepare(req));
    pg.push_back(gpu->prepare(req));
    with_images += req.find("\"images\"") != std::string::npos;
  }
  ASSERT_GE(with_images, 20u);
  double worst = 0;
  std::vector<const Prepared*> all;
  std::vector<test::Probs> alone;
  for (size_t k = 0; k < pc.size(); ++k) {
    alone.push_back(gpu->probs({&pg[k]})[0]);
    worst = std::max(worst, worst_diff(alone.back(), cpu->probs({&pc[k]})[0]));
    all.push_back(&pg[k]);
  }
  std::cout << "[ cuda    ] images through the engine, small (gain 0.5): " << pc.size() << " requests (" << with_images
            << " with images), GPU (bf16) vs CPU (fp32): worst |dp| = " << worst << "\n";
  EXPECT_LT(worst, 2e-3);
  const auto together = gpu->probs(all);
  for (size_t k = 0; k < pg.size(); ++k) EXPECT_EQ(together[k], alone[k]) << "request " << k << " in a batch of " << pg.size() << " vs alone";
}

// The reference's fixture (tiny-v: random weights that amplify rounding, as the other oracle
// folders do): the GPU's answers stay near the fp32 reference's, and it takes the images at all.
TEST(CudaVision, TinyVThroughTheGpuEngineAgainstTheReference) {
  NEED_GPU();
  EngineOptions o;
  o.device = Device::Cuda;
  auto gpu = Engine::load(test::source_path("tests/fixtures/oracle/tiny-v"), o);
  std::istringstream in(test::read_file(test::source_path("tests/fixtures/oracle/tiny-v.expected.jsonl")));
  double worst = 0;
  size_t n = 0;
  for (std::string line; std::getline(in, line); ++n) {
    const json::Value rec = json::parse(line);
    const Prepared p = gpu->prepare(json::write(*rec.find("request")));
    worst = std::max(worst, worst_diff(gpu->probs({&p})[0], test::probs_of(*rec.find("probs"))));
  }
  std::cout << "[ cuda    ] tiny-v on the GPU: " << n << " requests, worst |p - p_ref32| = " << worst << "\n";
  EXPECT_LT(worst, 0.5);  // the bound of CudaEngine.TinyAAgainstReference: these folders amplify bf16 rounding
}

// The profile's two details on a request with images: Stages times the embedding, the tower, the
// backbone and the head (what the bench reports as the tower's time), Ops every op (the tower's
// "vision ..." among them); Off records nothing; the answers do not move.
TEST(CudaVision, ProfileStagesAndOps) {
  NEED_GPU();
  EngineOptions o;
  o.device = Device::Cuda;
  o.prefix_cache_gib = 0;  // every run whole, the tower included
  auto gpu = Engine::load(test::source_path("tests/fixtures/oracle/tiny-v"), o);
  std::istringstream in(test::read_file(test::source_path("tests/fixtures/oracle/tiny-v.expected.jsonl")));
  std::optional<Prepared> p;
  for (std::string line; !p && std::getline(in, line);) {
    const json::Value rec = json::parse(line);
    const json::Value* req = rec.find("request");
    if (req->find("images") && !req->find("images")->arr.empty()) p = gpu->prepare(json::write(*req));
  }
  ASSERT_TRUE(p) << "the fixture has a request with images";
  const auto plain = gpu->probs({&*p});
  gpu->set_profile(ProfileDetail::Stages);
  gpu->clear_profile();
  EXPECT_EQ(gpu->probs({&*p}), plain);
  std::vector<std::string> names;
  for (const auto& [name, ms] : gpu->profile()) {
    names.push_back(name);
    EXPECT_GT(ms, 0.0) << name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "vision tower", "backbone", "head"}));
  gpu->set_profile(ProfileDetail::Ops);
  gpu->clear_profile();
  EXPECT_EQ(gpu->probs({&*p}), plain);
  size_t vision_ops = 0;
  for (const auto& [name, ms] : gpu->profile()) vision_ops += name.rfind("vision ", 0) == 0;
  EXPECT_GE(vision_ops, 5u) << "the tower's ops in the Ops profile";
  gpu->set_profile(ProfileDetail::Off);
  gpu->clear_profile();
  gpu->probs({&*p});
  EXPECT_TRUE(gpu->profile().empty());
}

}  // namespace
}  // namespace clefrt
