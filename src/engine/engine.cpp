// The public face (include/clefrt/clefrt.h): clefrt::Engine = the engine core (weights and the
// forward, engine_core.h) + the scheduler (scheduler.h) + the protocol (schema/): requests are
// parsed, validated and encoded once here, above the backends.
#include <clefrt/clefrt.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <future>
#include <mutex>

#include "common/error.h"
#include "common/json.h"
#include "common/log_event.h"
#include "engine/engine_core.h"
#include "engine/prepared.h"
#include "engine/scheduler.h"
#include "engine/warmup.h"
#include "model/batch.h"
#include "model/synth.h"
#include "schema/answers.h"
#include "schema/encode.h"
#include "schema/openai_shape.h"
#include "schema/request.h"

namespace clefrt {

struct Prepared::Impl {
  Request req;
  Encoded enc;
  json::Value body;  // the OpenAI-shaped body as it came (its answers follow its question order)
  bool openai = false;
  bool encoded_only = false;  // prepare_encoded: no request behind it
  std::shared_ptr<const ImageMedia> media;  // the images' tower rows and positions (null: none)
};

model::Sequence sequence_of(const Prepared& p) {
  const Prepared::Impl& i = p.impl();
  return model::sequence_of(i.enc, i.media ? &i.media->media : nullptr);
}

Prepared::Prepared() = default;
Prepared::Prepared(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

const Encoded& Prepared::encoded() const {
  if (!impl_) throw Error(Status::Internal, "internal_error", "an empty Prepared request");
  return impl_->enc;
}
size_t Prepared::input_tokens() const { return encoded().input_ids.size(); }
const std::string& Prepared::model() const {
  static const std::string none;
  return impl_ ? impl_->req.model : none;
}

std::string Prepared::answer(const Probs& probs, const AnswerOptions& opts, const std::string& model, size_t cached_tokens) const {
  const Impl& p = impl();
  const std::string name = p.req.model.empty() ? model : p.req.model;
  if (p.encoded_only) throw Error(Status::Internal, "internal_error", "a request prepared from its encoding has no answer shape");
  const size_t dropped = p.enc.state_tokens_dropped;
  const Usage u{input_tokens(), cached_tokens, dropped};
  return p.openai ? openai_response(name, p.body, p.req, probs, u, opts) : response_json(name, p.req, probs, u, opts);
}

std::string Prepared::encoded_json() const { return encoded_to_json(encoded()); }

struct Engine::Impl {
  EngineOptions opts;
  RequestLimits limits;
  std::unique_ptr<EngineCore> core;
  std::unique_ptr<Scheduler> sched;  // none when the weights were not loaded

  Scheduler& scheduler() const {
    if (!sched) throw Error(Status::Unavailable, "unavailable", "this engine was opened without its weights (load_weights = false)");
    return *sched;
  }
};

namespace {

CoreOptions core_options(const EngineOptions& o) {
  CoreOptions c;
  c.threads = o.threads;
  c.device = o.device;
  if (o.device == Device::Auto) {
    std::string why;
    c.device = cuda_available(&why) ? Device::Cuda : Device::Cpu;
    // not silently: a user who expected the GPU learns why the CPU runs it
    if (c.device == Device::Cpu && o.progress && o.load_weights)
      log_event("\"event\":\"device\",\"device\":\"cpu\",\"why\":" + json::write(json::Value::string("--device auto: " + why)));
  }
  if (c.device == Device::Cpu && o.step_layers > 0 && o.load_weights)
    throw Error(Status::BadRequest, "usage", "--step-layers is a GPU option (the CPU engine's steps run every layer: --step-tokens)");
  c.quant = o.quant;
  c.offload_embeddings = o.offload_embeddings;
  c.vision = o.vision;
  c.w4a16_fused = o.w4a16_fused;
  c.native_fp4 = o.native_fp4;
  c.portable_kernels = o.portable_kernels;
  c.attention = o.attention;
  c.cuda_graphs = int64_t(o.cuda_graphs);
  c.progress = o.progress;
  c.fit_memory = o.fit_memory;
  c.batch_invariant = o.batch_invariant;
  c.check_weights = o.check_weights;
  c.load_weights = o.load_weights;
  c.encode.max_length = o.max_length;
  c.encode.user_text = o.parse_special ? AddedTokens::Parse : AddedTokens::Plain;
  // the GPU plans its activation memory for the largest forward the scheduler can pack
  c.max_batch_tokens = int64_t(std::max(o.max_batch_tokens, o.max_length));
  c.max_batch_requests = int64_t(o.max_batch_requests);
  // the default budget (host memory on the CPU, GPU memory on the GPU; shrunk at load to half
  // of what the weights leave)
  const double gib = o.prefix_cache_gib >= 0 ? o.prefix_cache_gib : 4.0;
  c.prefix_cache_bytes = size_t(gib * double(size_t(1) << 30));
  c.prefix_cache_default = o.prefix_cache_gib < 0;
  c.prefix_cache_host_bytes = size_t(o.prefix_cache_host_gib * double(size_t(1) << 30));
  return c;
}

SchedulerOptions scheduler_options(const EngineOptions& o) {
  SchedulerOptions s;
  s.max_batch_tokens = o.max_batch_tokens;
  s.max_batch_requests = o.max_batch_requests;
  s.max_queue = o.max_queue;
  s.step_tokens = o.step_tokens;  // 0: the engine's default (Scheduler)
  s.step_layers = o.step_layers;
  s.batch_wait = std::chrono::microseconds(int64_t(std::llround(o.batch_wait_ms * 1e3)));
  return s;
}

void check_options(const EngineOptions& o) {
  auto bad = [](const std::string& m) { throw Error(Status::BadRequest, "usage", m); };
  if (o.max_length == 0) bad("max_length must be at least 1 token");
  if (o.cuda_graphs == 1) bad("cuda_graphs: 0 (off) or at least 2 (a shape's first forward tunes its GEMMs, which a capture cannot hold)");
  if (o.max_length > kMaxContext)
    bad("max_length is at most " + std::to_string(kMaxContext) + " tokens (Clef's context window), not " + std::to_string(o.max_length));
  if (!(o.prefix_cache_gib >= 0 || o.prefix_cache_gib == -1)) bad("prefix_cache_gib must be 0 (off), a budget in GiB, or -1 (the default)");
  if (!(o.prefix_cache_host_gib >= 0 && std::isfinite(o.prefix_cache_host_gib))) bad("prefix_cache_host_gib must be 0 (off) or a budget in GiB");
  if (o.prefix_cache_host_gib > 0 && o.prefix_cache_gib == 0) bad("prefix_cache_host_gib is a second tier of the prefix cache, which prefix_cache_gib 0 turns off");
  if (o.max_batch_tokens == 0) bad("max_batch_tokens must be at least 1");
  if (o.max_batch_requests == 0) bad("max_batch_requests must be at least 1");
  if (o.max_queue == 0) bad("max_queue must be at least 1 (0 would refuse every request)");
  if (!(o.batch_wait_ms >= 0 && o.batch_wait_ms <= 1000)) bad("batch_wait_ms must be from 0 (never wait) to 1000 ms");
  if (o.threads < 0) bad("threads must be 0 (all cores) or more");
}

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() { stop(); }

// One path for every way of opening an engine: the options checked, the core opened by `open`,
// the scheduler started when there are weights to run.
std::unique_ptr<Engine> Engine::open(EngineOptions opts, const std::function<void(Impl&)>& open_core) {
  check_options(opts);
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  impl->limits.require_instructions = opts.require_instructions;
  open_core(*impl);
  if (opts.warmup && opts.load_weights) warm_up(*impl->core, opts, impl->limits);  // before any request can come
  if (opts.load_weights) impl->sched = std::make_unique<Scheduler>(*impl->core, scheduler_options(opts));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

std::unique_ptr<Engine> Engine::load(const std::string& dir, const EngineOptions& opts) {
  return open(opts, [&](Impl& i) { i.core = EngineCore::load(dir, core_options(i.opts)); });
}

std::unique_ptr<Engine> Engine::synthetic(const std::string& preset, const std::string& tokenizer, const EngineOptions& opts) {
  EngineOptions o = opts;
  o.load_weights = true;  // random weights are made on the GPU
  return open(o, [&](Impl& i) { i.core = EngineCore::synthetic(preset, tokenizer, core_options(i.opts)); });
}

std::unique_ptr<Engine> Engine::tokenizer_only(const std::string& tokenizer, const EngineOptions& opts) {
  EngineOptions o = opts;
  o.load_weights = false;
  return open(o, [&](Impl& i) { i.core = EngineCore::tokenizer_only(tokenizer, core_options(i.opts)); });
}

Prepared Engine::prepare(std::string_view body, BodyShape shape) const {
  auto p = std::make_shared<Prepared::Impl>();
  json::Value root = json::parse(body, json::ParseOptions{impl_->limits.max_json_depth});
  if (shape == BodyShape::Decisions && root.is_object()) {
    const json::Value* q = root.find("questions");
    if (q && q->is_array()) {
      p->openai = true;
      p->req = parse_request(openai_to_system_one(root), impl_->limits);
      p->body = std::move(root);
    }
  }
  if (!p->openai) p->req = parse_request(root, impl_->limits);
  p->enc = impl_->core->encoder().encode(p->req);
  // images through the tower here, on the caller's thread; what the backends cannot run is
  // refused here, before any queue
  p->media = impl_->core->image_media(p->req, p->enc);
  Prepared out(std::move(p));
  (void)sequence_of(out);
  return out;
}

Prepared Engine::prepare_encoded(Encoded e) const {
  auto p = std::make_shared<Prepared::Impl>();
  p->enc = std::move(e);
  p->encoded_only = true;
  return Prepared(std::move(p));
}

std::shared_ptr<Ticket> Engine::submit(Prepared p, std::chrono::steady_clock::time_point deadline,
                                       std::function<void(const Prepared&, Outcome)> done) {
  return impl_->scheduler().submit(std::move(p), deadline, std::move(done));
}

std::vector<Probs> Engine::probs(const std::vector<const Prepared*>& requests, std::vector<size_t>* cached_tokens) {
  // Queued a forward's worth at a time (the engine thread sees each group at once and packs it
  // together), at most two groups ahead, so a list longer than the queue still runs.
  const size_t group = std::max<size_t>(1, std::min(impl_->opts.max_batch_requests, impl_->opts.max_queue / 2));
  std::vector<std::promise<Outcome>> promises(requests.size());
  std::vector<std::future<Outcome>> futures;
  for (auto& p : promises) futures.push_back(p.get_future());
  std::vector<Probs> out(requests.size());
  if (cached_tokens) cached_tokens->assign(requests.size(), 0);
  std::exception_ptr first;
  size_t collected = 0;
  auto collect_until = [&](size_t n) {
    for (; collected < n; ++collected) {
      Outcome o = futures[collected].get();
      if (o.kind == Outcome::Kind::Failed && !first) first = o.error;
      if (o.kind == Outcome::Kind::Cancelled && !first)
        first = std::make_exception_ptr(Error(Status::Unavailable, "unavailable", "the engine stopped before the request ran"));
      out[collected] = std::move(o.probs);
      if (cached_tokens) (*cached_tokens)[collected] = o.cached_tokens;
    }
  };
  for (size_t begin = 0; begin < requests.size(); begin += group) {
    if (begin >= 2 * group) collect_until(begin - group);
    std::vector<Scheduler::Submission> subs;
    for (size_t i = begin; i < std::min(requests.size(), begin + group); ++i)
      subs.push_back({*requests[i], std::chrono::steady_clock::time_point::max(),
                      [p = &promises[i]](const Prepared&, Outcome o) { p->set_value(std::move(o)); }});
    try {
      impl_->scheduler().submit_all(std::move(subs));
    } catch (...) {
      collect_until(begin);  // what was queued still runs: wait for it, then report
      throw;
    }
  }
  collect_until(requests.size());
  if (first) std::rethrow_exception(first);
  return out;
}

std::string Engine::decide(std::string_view body, const AnswerOptions& opts, BodyShape shape) {
  const Prepared p = prepare(body, shape);
  std::promise<Outcome> promise;
  auto future = promise.get_future();
  submit(p, std::chrono::steady_clock::time_point::max(), [&promise](const Prepared&, Outcome o) { promise.set_value(std::move(o)); });
  Outcome o = future.get();
  if (o.kind == Outcome::Kind::Failed) std::rethrow_exception(o.error);
  if (o.kind != Outcome::Kind::Answered) throw Error(Status::Unavailable, "unavailable", "the engine stopped before the request ran");
  return p.answer(o.probs, opts, "clef", o.cached_tokens);
}

bool Engine::queue_full() const { return impl_->scheduler().full(); }
size_t Engine::queued() const { return impl_->sched ? impl_->sched->queued() : 0; }
void Engine::pause(bool on) { impl_->scheduler().pause(on); }
void Engine::set_observer(SchedulerObserver o) { impl_->scheduler().set_observer(std::move(o)); }
void Engine::stop() {
  if (impl_ && impl_->sched) impl_->sched->stop();
}

Device Engine::device() const { return impl_->core->device(); }
const char* Engine::format() const { return impl_->core->format(); }
size_t Engine::gpu_bytes() const { return impl_->core->gpu_bytes(); }
std::string Engine::summary() const { return impl_->core->gpu_summary(); }
size_t Engine::max_length() const { return impl_->opts.max_length; }
MemoryUse Engine::memory() const { return impl_->core->memory(); }
PrefixCacheStats Engine::prefix_cache() const { return impl_->core->prefix_cache_stats(); }
double Engine::forward_flops(const std::vector<int64_t>& lengths) const { return impl_->core->forward_flops(lengths); }

void Engine::observe_linear_inputs(LinearInputObserver o) { impl_->core->set_linear_input_observer(std::move(o)); }
void Engine::set_profile(ProfileDetail detail) { impl_->core->set_profile(detail); }
std::vector<std::pair<std::string, double>> Engine::profile() const { return impl_->core->profile(); }
void Engine::clear_profile() { impl_->core->clear_profile(); }

void synthesize(const SynthOptions& o) {
  model::SynthOptions m;
  m.out_dir = o.out_dir;
  m.preset = o.preset;
  m.tokenizer = o.tokenizer;
  m.seed = o.seed;
  m.linear_gain = o.linear_gain;
  m.progress = o.progress;
  model::synthesize(m);
}


}  // namespace clefrt
