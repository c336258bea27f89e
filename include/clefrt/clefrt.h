// clefrt: joint-schema decision models (Cloudflare's Clef 27B, Clef-flash 9B and fine-tunes in
// their release layout) in C++. A request holds a state (text, JSON, images) and typed questions
// (noul, choice, score); the model gives a probability for every allowed option in one forward.
//
// This is the library's one public header: the `clefrt` command line, the HTTP server and the
// Python module are written against it alone.
//
//   auto engine = clefrt::Engine::load("/models/clef", {});       // throws clefrt::Error
//   std::string answer = engine->decide(R"({"state": "Checkout is down",
//       "questions": {"outage": {"type": "noul"}}})");           // the System One response
//
// Threads: an Engine may be used from any number of threads at once. Forwards run on one
// engine thread that packs the requests waiting at that moment into shared forwards (up to
// EngineOptions::max_batch_tokens); a request's answer does not depend on what it was packed
// with. Calls that wait for answers (probs, decide) block the calling thread only.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace clefrt {

// -----------------------------------------------------------------------------------------
// Errors

// The HTTP status the System One protocol assigns to each kind of failure.
enum class Status : int {
  BadRequest = 400,          // malformed JSON or wrong shape
  Unauthorized = 401,
  PayloadTooLarge = 413,     // body over the limit, or a prompt that cannot fit the context
  Unprocessable = 422,       // valid JSON that breaks a limit or rule
  TooManyRequests = 429,
  Internal = 500,
  Unavailable = 503,
};

// Every failure the library reports. It carries the HTTP status, a short machine-readable type
// ("invalid_request", "validation_error", "context_length_exceeded", "load_error",
// "non_finite", ...), a message for people, and where it happened: the JSON path of the field
// at fault (`questions.team.criteria`) or the file / tensor. what() is "where: message".
class Error : public std::runtime_error {
 public:
  Error(Status status, std::string type, std::string message, std::string where = {});
  Status status() const { return status_; }
  int http_status() const { return static_cast<int>(status_); }
  const std::string& type() const { return type_; }
  const std::string& where() const { return where_; }
  const std::string& message() const { return message_; }
  // `{"error":{"type":...,"message":...,"details":{"path":...}}}` (details only with a path)
  std::string to_json() const;

 private:
  Status status_;
  std::string type_, message_, where_;
};

// -----------------------------------------------------------------------------------------
// Options

enum class Device { Auto, Cpu, Cuda };

// CUDA: the attention kernel of the backbone and of the vision tower. Auto: cuDNN's fused attention where libcudnn.so.9 (9.5 or
// newer) loads, else clefrt's own (the load line says which, and why). Cudnn: refused at load when
// it does not load. Clefrt: clefrt's own kernels (mma.sync flash attention, causal with the gate
// fused for the backbone, bidirectional per frame for the tower).
// Both are batch-invariant and give the prefix cache and steps their bits; they differ from each
// other in the last bits (bf16 rounding points).
enum class AttentionKernel { Auto, Cudnn, Clefrt };
const char* attention_kernel_name(AttentionKernel a);        // "auto", "cudnn", "clefrt"
AttentionKernel parse_attention_kernel(const std::string& name);  // throws otherwise
const char* device_name(Device d);  // "auto", "cpu", "cuda"

// What the GPU engine runs the backbone's Linears in. Auto: what the folder holds, tensor by
// tensor (bf16 for synthetic weights). The CPU engine runs what the folder holds (dequantized at
// load) and accepts only Auto.
enum class QuantMode { Auto, BF16, FP8, NVFP4, NVFP4_W4A16 };
// "auto", "bf16", "fp8", "nvfp4", "nvfp4-w4a16" (the community runtime's names); throws a 400
// Error naming the accepted ones otherwise.
QuantMode parse_quant_mode(const std::string& s);
const char* quant_mode_name(QuantMode m);

// How much Engine::set_profile times (CUDA): nothing, the forward's stages, or every op.
enum class ProfileDetail { Off, Stages, Ops };

// The `confidence` of choice and score answers.
enum class Confidence {
  Reference,  // max p (the reference code; default)
  Purity,     // (sum p^2 - 1/n) / (1 - 1/n) (hosted Clef)
  Jev,        // (max p - 1/n) / (1 - 1/n)
};
Confidence parse_confidence(const std::string& name);  // "reference", "purity", "jev"; throws otherwise

// EngineOptions::cuda_graphs' default: a shape's second forward is captured (its first tunes the GEMMs)
constexpr size_t kCudaGraphsAfter = 2;

struct EngineOptions {
  // --- where and how the model runs. The options marked CUDA / GPU are refused (Error, "usage")
  // by an engine that runs on the CPU when set away from their defaults: an option that would
  // do nothing is a wrong belief about what ran. native_fp4 and fit_memory are the exceptions:
  // without effect where there is nothing to choose (off Blackwell; a plan that fits).
  Device device = Device::Auto;        // Auto: CUDA when this build has it and a GPU is present, else the CPU
  QuantMode quant = QuantMode::Auto;   // CUDA: the Linears' format (above)
  bool offload_embeddings = false;     // CUDA, lean memory: embed_tokens / lm_head stay in pinned host memory,
                                       // the MLP runs in 1,024-token blocks, the GDN in 16-chunk passes
                                       // (the same answers bit for bit; a little slower on long inputs)
  bool w4a16_fused = false;            // CUDA, NVFP4 parts: the fused W4A16 GEMM instead of dequantizing a
                                       // chunk ahead (no staging memory; slower on the H200 at Clef's shapes)
  bool native_fp4 = true;              // CUDA, W4A4 parts on Blackwell (compute capability >= 10): FP4 tensor
                                       // cores (UNTESTED: no such GPU here); false keeps the emulated path,
                                       // its oracle. Hopper and older always emulate
  bool vision = true;                  // load the folder's vision tower (when it has one); false: text only, the
                                       // tower's weights stay on disk (~0.9 GiB on the GPU for Clef's) and a
                                       // request with images is a 422
  bool fit_memory = false;             // CUDA, quant Auto, no offload / fused kernel asked for: when the memory plan
                                       // does not fit the GPU, load the first format (converted at load), offload
                                       // and W4A16 kernel that does (logged with progress) instead of refusing;
                                       // never a shorter context
  bool portable_kernels = false;       // CUDA: only the kernels every supported GPU (compute capability >= 8.0)
                                       // runs: mma.sync for the W4A16 GEMM instead of wgmma / TMA, W4A4
                                       // emulated; to check them against the fast ones on Hopper / Blackwell
  AttentionKernel attention = AttentionKernel::Auto;  // CUDA: the backbone's attention kernel (above)
  size_t cuda_graphs = kCudaGraphsAfter;  // CUDA: a batch shape (sequence lengths, questions, options per question)
                                       // seen this many times (>= 2) is captured into a CUDA graph and replayed
                                       // from then on: its kernels back to back, the same bits. Batches with
                                       // images or that use the prefix cache, and NVFP4 staging, run as
                                       // always. 0: off
  bool warmup = false;                 // CUDA: before the engine takes requests, forwards of made-up ones meet the
                                       // sizes the usual batches have (batches of 2, 4, 8, ... up to a full
                                       // forward of 320-token requests; one request each of 2,048 and 8,192
                                       // tokens), so that the first real requests of a size do not pay for
                                       // what is chosen at a size's first forward (the GEMM algorithm of each
                                       // m bucket, the attention plans; a single short request's smallest
                                       // bucket is left to the first real one). Seconds at open. `clefrt
                                       // serve` turns it on. The CPU has nothing to warm and skips it
  int threads = 0;                     // CPU engine threads (0: all cores)
  bool batch_invariant = true;         // a request's answer does not depend on its batch (CUDA: GEMM
                                       // algorithms fixed per shape class; CPU: one forward per request)
  bool check_weights = true;           // test every floating-point weight for NaN / infinity at load and
                                       // refuse the folder naming the tensor (one more pass over the weights)
  bool load_weights = true;            // false: config and tokenizer only; prepare() works, answers throw
  bool progress = false;               // loading reports its stages on stderr: on a terminal a line per stage
                                       // updated in place (GB, GB/s), otherwise one JSON line as each ends
  double prefix_cache_gib = -1;        // the prefix cache's budget: a request whose ids start with a cached
                                       // system prompt + state computes only the rest, with the same bits.
                                       // 0: off. -1: the default, 4 GiB (host memory on the CPU, GPU memory
                                       // on the GPU), at most half of the memory the weights leave
  double prefix_cache_host_gib = 0;    // GPU engines: a second tier of this many GiB of pinned host memory:
                                       // prefixes the GPU budget evicts wait there and come back by a copy
                                       // on their next hit (the same bits). 0: off (evicted prefixes go)

  // --- requests
  size_t max_length = 16384;           // context length in tokens, at most kMaxContext: a state is cut to fit; a schema that
                                       // alone does not fit is a 413 ("maximum context length")
  bool parse_special = false;          // special-token text in user content becomes the special token, as the
                                       // reference does (default: user text never becomes an added token)
  bool require_instructions = false;   // a missing / null / empty instruction is a 422 (hosted Clef's rule;
                                       // default: the question id stands in, the reference's rule)

  // --- scheduling
  size_t max_batch_tokens = 16384;     // tokens packed into one forward (a longer request runs alone)
  size_t max_batch_requests = 64;      // requests packed into one forward
  size_t max_queue = 256;              // requests waiting for the engine before submit() refuses (429)
  double batch_wait_ms = 0;            // after a forward of several requests, the engine waits up to this long
                                       // from its end for as many to be queued again before it starts the next
                                       // (clients that send their next request when an answer arrives come back
                                       // together: without it the batches alternate between a few requests and
                                       // the rest). A lone request never waits. 0 (the default): never wait; on
                                       // an H100 2 ms evened the batches but gained no throughput (README)
  size_t step_tokens = 0;              // a longer request (on the GPU: over 4x as long) runs in steps of about
                                       // this many tokens, one long request at a time, with the requests that
                                       // arrive meanwhile answered between its steps (they wait one step at
                                       // most); the same answers. 0: the device's default (CPU 1,024, GPU 2,048)
  size_t step_layers = 0;              // GPU: a step runs this many backbone layers at a time, with the requests
                                       // that arrive meanwhile answered between them (they wait a few layers of
                                       // a step, not a whole one); the same answers. 0: the default (4); the
                                       // CPU runs a step's layers together
};

// Clef's context window: the largest max_length.
constexpr size_t kMaxContext = 65536;

// How an answer is rendered.
struct AnswerOptions {
  Confidence confidence = Confidence::Reference;
  bool precise = false;  // numbers unrounded (default: Python's round(x, 4))
};

// -----------------------------------------------------------------------------------------
// Requests

struct Span {
  int32_t begin = 0, end = 0;  // half-open token range over the whole sequence
};

enum class QuestionType : uint8_t { Noul = 0, Choice = 1, Score = 2 };  // the type ids of the head
const char* type_name(QuestionType t);                                  // "noul", "choice", "score"

struct EncodedQuestion {
  std::string id;
  QuestionType type = QuestionType::Noul;
  Span question_span;
  std::vector<Span> option_spans;       // encoded option order
  std::vector<std::string> option_ids;  // encoded option order: noul "true", "false"; choice labels
                                        // sorted by code point; score "0".."n-1"
};

struct EncodedImage {
  uint32_t grid_t = 1, grid_h = 0, grid_w = 0;  // patches (before the 2x2 merge)
  uint32_t width = 0, height = 0;               // resized pixels
  Span pad_span;                                 // the <|image_pad|> tokens
};

// A request as the model reads it (spec/model.md 3).
struct Encoded {
  std::vector<int32_t> input_ids;
  std::vector<EncodedQuestion> questions;
  std::vector<EncodedImage> images;
  Span state_span;
  size_t state_tokens_dropped = 0;  // tokens cut from the end of the state by max_length
};

// `e` with `extra` random token ids in front and its spans shifted: a request made longer for a
// benchmark or the warm-up (Engine::prepare_encoded runs it). The ids are from 1,000 to 100,000,
// below `vocab` when it is given (from vocab / 2 when that is under 2,000). Seeded: two calls with
// the same seed and extra put the same ids in front. extra <= 0: `e` as it is.
Encoded random_prefixed(const Encoded& e, int64_t extra, uint64_t seed, int64_t vocab = 0);

// Per question (request order), per option (encoded order), the probability.
using Probs = std::vector<std::vector<double>>;

// The prefix cache's counters since load (EngineOptions::prefix_cache_gib).
struct PrefixCacheStats {
  bool enabled = false;
  size_t budget_bytes = 0;
  int64_t granularity = 0;  // prefixes are reused in multiples of this many tokens
  size_t bytes = 0;         // held now
  size_t entries = 0;
  uint64_t hits = 0;        // requests that continued a cached prefix
  uint64_t misses = 0;      // requests long enough to look one up that found none
  uint64_t hit_tokens = 0;  // tokens read from the cache instead of computed
  uint64_t inserted = 0;
  uint64_t evictions = 0;
  uint64_t too_large = 0;   // states not kept: over the budget alone, or the rest held by running batches
  // the host tier (GPU engines, EngineOptions::prefix_cache_host_gib; all 0 without it)
  size_t host_budget_bytes = 0;
  size_t host_bytes = 0;          // held now in pinned host memory
  size_t host_entries = 0;
  uint64_t host_hits = 0;         // hits (counted in hits too) copied back from the host tier
  uint64_t host_hit_tokens = 0;
  uint64_t to_host = 0;           // entries the GPU budget evicted that were copied to the host tier
  uint64_t host_evictions = 0;    // dropped from the host tier for room
};

// The bodies a request may come in. SystemOne: the System One request. Decisions: what clients
// send to `POST /v1/decisions`: System One when `questions` is an object, the OpenAI decisions
// shape when it is an array (answered in the shape it came in).
enum class BodyShape { SystemOne, Decisions };

// A request parsed, validated and encoded: what the engine runs and what answer() renders.
// Cheap to copy (shared, immutable).
class Prepared {
 public:
  Prepared();
  const Encoded& encoded() const;
  size_t input_tokens() const;
  // The `model` the request named, or "" when it named none.
  const std::string& model() const;
  // The response in the request's own shape: System One `{"model", "answers", "usage"}` or the
  // OpenAI decisions shape. `model` stands in when the request named none.
  // `cached_tokens` goes to usage.cached_tokens (Outcome::cached_tokens).
  std::string answer(const Probs& probs, const AnswerOptions& opts, const std::string& model = "clef", size_t cached_tokens = 0) const;
  // `{"input_ids":[...],"questions":[...],"usage":{"input_tokens":N}}`: what `clefrt encode` prints.
  std::string encoded_json() const;

  struct Impl;  // the library's
  explicit Prepared(std::shared_ptr<const Impl> impl);
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

// -----------------------------------------------------------------------------------------
// Scheduling: what the server builds on (probs() and decide() are made of it)

// How a submitted request ended. Answered: probs holds its probabilities; Failed: error holds
// what the engine threw (a clefrt::Error); TimedOut: its deadline passed first, queued or running;
// Cancelled: cancel() came first.
struct Outcome {
  enum class Kind { Answered, Failed, TimedOut, Cancelled } kind = Kind::Answered;
  Probs probs;
  std::exception_ptr error;
  double queue_ms = 0;    // from submit() to the forward that ran it (to the end, if none did)
  double compute_ms = 0;  // that forward's time
  size_t cached_tokens = 0;  // leading tokens read from the prefix cache instead of computed
  size_t batch_requests = 0;  // requests in that forward, this one included (0: none ran it)
};

// A submitted request. It ends exactly once; cancel() after that does nothing.
class Ticket {
 public:
  virtual ~Ticket() = default;
  virtual void cancel() = 0;
  virtual bool ended() const = 0;
};

// What the engine thread reports as it works (for metrics): each forward's size, and the queue
// depth when it changes. Called on the engine thread; must not block.
struct SchedulerObserver {
  std::function<void(size_t requests, size_t tokens)> batch;
  std::function<void(size_t waiting)> queue_depth;
};

// -----------------------------------------------------------------------------------------
// The engine

// Where an engine's memory goes (bytes; zeros on the CPU).
struct MemoryUse {
  size_t weights = 0;           // the weights on the GPU
  size_t weights_reserved = 0;  // GPU memory held for them (2 MiB granules)
  size_t weights_host = 0;      // pinned host memory (offloaded embeddings)
  size_t working = 0;           // activation arena, cuBLASLt workspace, NVFP4 staging
  size_t linear_bf16 = 0, linear_nvfp4 = 0, linear_fp8 = 0;  // the backbone's Linears by format
};

// The card's own limits, measured (not a datasheet's): bf16 GEMM rate through cuBLASLt
// (8192^3, fp32 accumulate) and device-to-device copy bandwidth. CUDA only (throws otherwise).
struct Hardware {
  std::string gpu;
  double mem_total_gib = 0;
  double peak_bf16_tflops = 0;
  double copy_gbps = 0;  // bytes read + written per second
};
Hardware measure_hardware();
// The GPU the CUDA engine runs on (device 0), read from the driver (no measurement). CUDA only.
struct GpuInfo {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  double memory_gib = 0;
};
GpuInfo gpu_info();
// The GPU's energy counter and clocks, read through the driver's NVML (opened at run time): for
// benchmarks, since a card under sustained load may run at its power cap, below its boost clock.
// Never throws: available is false (why says what was missing) without CUDA, NVML or an energy
// counter (NVML has one from Volta on).
struct GpuPower {
  bool available = false;
  std::string why;
  double energy_j = 0;        // joules since the driver loaded: two readings' difference is a run's energy
  double sm_clock_mhz = 0;    // the SM clock now
  double power_w = 0;         // the draw now
  bool power_capped = false;  // the driver holds the clock down for power now (software power cap)
};
GpuPower gpu_power();
// Starts (true) or ends (false) the region that a profiler run with collection off at the start
// records (cudaProfilerStart / cudaProfilerStop; Nsight Compute's --profile-from-start off): for
// benchmarks, to leave loading and the first calls' GEMM tuning out of a profile. Throws a 503
// without CUDA.
void gpu_profiler_range(bool start);
// GPU memory in use on the device (total - free), CUDA context included; 0 without CUDA.
double gpu_memory_in_use_gib();
// Makes device 0 look like a card of `card_gib` GiB: allocates everything free beyond that (what
// is in use now counts) and holds it until the returned holder is released; *held_gib gets its
// size. What runs meanwhile (loading, the prefix cache's default budget, a long request's state)
// meets the smaller card's limits. Throws a 503 without CUDA, a 400 when less than that is in use
// plus free. `clefrt bench --gpu-limit-gib`.
std::shared_ptr<void> hold_gpu_memory_beyond(double card_gib, double* held_gib);

// A backbone Linear's input as the CPU forward meets it: the weight's tensor name
// ("model.language_model.layers.3.mlp.down_proj.weight") and the activations [rows, cols], fp32.
using LinearInputObserver = std::function<void(const std::string& weight, const float* x, int64_t rows, int64_t cols)>;

class Engine {
 public:
  // Loads and validates a release folder: config.json, tokenizer.json, the sharded safetensors
  // (bf16 / f16 / f32, NVFP4 or FP8 compressed-tensors), joint_head.*. Throws Error
  // ("load_error", the file / tensor at fault; 503 "device_unavailable" for a missing GPU).
  static std::unique_ptr<Engine> load(const std::string& dir, const EngineOptions& opts = {});
  // Random weights at a preset's real shapes ("clef-27b", "clef-flash", "small") made directly
  // in GPU memory, with a real tokenizer: benchmarks. CUDA only; the answers are noise.
  static std::unique_ptr<Engine> synthetic(const std::string& preset, const std::string& tokenizer, const EngineOptions& opts = {});
  // A bare Hugging Face tokenizer.json and no model: prepare() only (Qwen3.5's image geometry).
  static std::unique_ptr<Engine> tokenizer_only(const std::string& tokenizer, const EngineOptions& opts = {});
  ~Engine();

  // Parses, validates and encodes a request body (JSON text). Throws Error 400 / 413 / 422 naming
  // the field. Thread-safe; costs parsing and tokenization only.
  Prepared prepare(std::string_view body, BodyShape shape = BodyShape::SystemOne) const;

  // Probabilities for several prepared requests, run as packed forwards with whatever else is
  // waiting. Throws the first failure's Error (a failed request does not fail the others'
  // forwards, but this call reports it).
  // cached_tokens (optional): per request, Outcome::cached_tokens.
  std::vector<Probs> probs(const std::vector<const Prepared*>& requests, std::vector<size_t>* cached_tokens = nullptr);
  // A request given as its encoding (benchmarks with made-up token ids): probs() runs it,
  // answer() refuses (there is no request to answer in the shape of).
  Prepared prepare_encoded(Encoded e) const;
  // prepare + probs + answer: the System One (or OpenAI-shaped) response.
  std::string decide(std::string_view body, const AnswerOptions& opts = {}, BodyShape shape = BodyShape::SystemOne);

  // Queues a request that must end by `deadline`; `done` runs once, on the engine thread (answered
  // or failed), the deadline thread (timed out) or the caller of cancel(); it must not block, and
  // must not call probs() or decide() (they wait for the engine thread it runs on).
  // Throws Error 429 when max_queue requests wait, 503 once stop() has begun.
  std::shared_ptr<Ticket> submit(Prepared p, std::chrono::steady_clock::time_point deadline,
                                 std::function<void(const Prepared&, Outcome)> done);
  bool queue_full() const;  // whether submit() would refuse now (checked before work is spent on a body)
  size_t queued() const;
  void pause(bool on);      // tests: hold the engine thread (queued work waits) / let it go
  void set_observer(SchedulerObserver o);  // before the first submit
  void stop();              // refuses new work, finishes what is queued, joins the engine thread

  // --- what is loaded
  Device device() const;
  const char* format() const;  // what the Linears run in: "f32" (CPU), "bf16", "fp8", "nvfp4", "nvfp4-w4a16", "mixed"
  size_t gpu_bytes() const;    // GPU memory held (weights, activations, workspaces); 0 on the CPU
  std::string summary() const; // one line: what the Linears run in and where the memory goes ("" on the CPU)
  MemoryUse memory() const;
  PrefixCacheStats prefix_cache() const;
  size_t max_length() const;
  // Model FLOPs of one forward over requests of these lengths (every Linear: 2 per weight per
  // token; causal attention scores and values; the GDN recurrence and the head's small per-option
  // work left out, under 1% at Clef's shapes): what benchmarks divide by.
  double forward_flops(const std::vector<int64_t>& lengths) const;

  // --- calibration (the CPU engine only; Error otherwise): from now on every forward reports the
  // input of each backbone Linear before its product (what clefrt::quantize's W4A4 activation
  // scales are made from). Empty to stop. Called on the engine thread, one forward at a time.
  void observe_linear_inputs(LinearInputObserver o);

  // --- profiling (CUDA): times with CUDA events, by name, summed since the last clear, in ms.
  // Ops: every op (an event between every two kernels; the short ops' times hold the gaps those
  // events leave). Stages: "embed", "vision tower", "backbone", "head" only (five events a
  // forward: the kernels run back to back as they do unprofiled). set_profile(true) is Ops.
  void set_profile(ProfileDetail detail);
  void set_profile(bool on) { set_profile(on ? ProfileDetail::Ops : ProfileDetail::Off); }
  std::vector<std::pair<std::string, double>> profile() const;
  void clear_profile();

  struct Impl;  // the library's

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  static std::unique_ptr<Engine> open(EngineOptions opts, const std::function<void(Impl&)>& open_core);
  std::unique_ptr<Impl> impl_;
};

// Whether this build has the CUDA backend and a usable GPU (reason says why not, if not).
bool cuda_available(std::string* reason = nullptr);

// What a folder holds (architecture, sizes, parameter counts and dtypes per part) and its memory
// plan: the CPU's, and the CUDA engine's in each format with and without offloaded embeddings,
// for a batch of opts.max_length tokens. Reads headers only. What `clefrt inspect` prints.
std::string inspect(const std::string& dir, const EngineOptions& opts = {});

// Writes a random-weight folder in the exact release layout (sharded bf16 safetensors,
// config.json, joint_head.*, the given tokenizer.json): tests and benchmarks without the real
// weights. Random weights give meaningless answers.
struct SynthOptions {
  std::string out_dir;            // created
  std::string preset = "tiny";    // tiny | small | clef-flash | clef-27b
  std::string tokenizer;          // the tokenizer.json to ship with it
  uint64_t seed = 1;
  float linear_gain = 1.0f;       // Linear weights ~ normal(0, gain / sqrt(fan_in)); 0.5 is well conditioned under bf16
  bool progress = true;           // a line per layer on stderr
};
void synthesize(const SynthOptions& o);

// Writes a compressed-tensors copy of a bf16 release folder (spec/quant.md): what `clefrt
// quantize` runs. The bf16 keep-list (embeddings, lm_head, vision, GDN in_proj_a/b and conv1d,
// norms, the joint head) and the shared global scales (q/k/v, gate/up, GDN in_proj_qkv + z) are
// the loader's own recipe. Throws Error naming the file, record (file:line) or option at fault.
struct QuantizeOptions {
  std::string model_dir;                // the bf16 folder
  std::string out_dir;                  // created; must not exist or be empty
  std::string scheme = "nvfp4-w4a16";   // nvfp4-w4a16 (NVFP4 weights) | nvfp4 (W4A4: activation
                                        // scales calibrated) | fp8 (per-channel e4m3 weights,
                                        // dynamic per-token activations)
  std::string calib_file;               // nvfp4: System One bodies, one per line, run through the
                                        // CPU engine (observe_linear_inputs); a record over the
                                        // context is skipped and counted, an invalid one stops
  size_t calib_records = 256;           // at most this many calibration records are run
  int threads = 0;                      // CPU threads for calibration (0: all cores)
  bool progress = true;                 // progress on stderr
};
void quantize(const QuantizeOptions& o);

// "clefrt 0.1.0 (commit ..., CUDA ..., architectures ...)"
std::string version();

}  // namespace clefrt
