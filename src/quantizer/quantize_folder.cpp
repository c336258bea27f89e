// clefrt::quantize (include/clefrt/clefrt.h): a bf16 folder -> a compressed-tensors folder.
// The quantizer is a client of the engine, not part of its numerics: W4A4 calibration runs
// records through the public Engine (observe_linear_inputs), the conversions are quant/formats,
// the choice of tensors quant/recipe; nothing in src/quant depends on this file.
#include <clefrt/clefrt.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/file.h"
#include "common/json.h"
#include "common/progress.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"
#include "model/config.h"
#include "model/weights.h"
#include "quant/formats.h"
#include "quant/recipe.h"

namespace clefrt {

namespace fs = std::filesystem;
using json::Value;

namespace {

bool ends_with(const std::string& a, const std::string& b) { return a.size() >= b.size() && a.compare(a.size() - b.size(), b.size(), b) == 0; }

bool quantized_linear(const io::TensorInfo& t, bool nvfp4) { return quant::recipe_quantizes(t.name, t.shape, nvfp4); }

// max |input activation| per Linear module, over every calibration forward
struct Calibration {
  std::map<std::string, float> amax;
  void observe(const std::string& weight, const float* x, int64_t rows, int64_t cols) {
    if (!ends_with(weight, ".weight")) return;
    float m = 0;
    for (int64_t i = 0; i < rows * cols; ++i) m = std::fmax(m, std::fabs(x[i]));
    float& a = amax[weight.substr(0, weight.size() - 7)];
    a = std::fmax(a, m);
  }
};

// Runs up to o.calib_records records of o.calib_file through the CPU engine, observing every
// backbone Linear's input. Records go in groups so the progress line moves; the maximum does
// not depend on the order.
Calibration calibrate(const QuantizeOptions& o) {
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.threads = o.threads;
  auto engine = Engine::load(o.model_dir, eo);
  std::ifstream in(o.calib_file);
  if (!in) throw load_error(o.calib_file, "cannot read the calibration records");
  Calibration cal;
  engine->observe_linear_inputs([&cal](const std::string& w, const float* x, int64_t rows, int64_t cols) { cal.observe(w, x, rows, cols); });
  std::string line;
  size_t n = 0, line_no = 0, too_long = 0, first_too_long = 0;
  std::vector<Prepared> group;
  StatusLine status;
  auto run_group = [&] {
    std::vector<const Prepared*> ptrs;
    for (const Prepared& p : group) ptrs.push_back(&p);
    engine->probs(ptrs);
    n += group.size();
    group.clear();
    if (o.progress) status.update("quantize: calibration " + std::to_string(n) + "/" + std::to_string(o.calib_records) + " records");
  };
  try {
    while (n + group.size() < o.calib_records && std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        group.push_back(engine->prepare(line));
      } catch (const Error& err) {
        // A valid record over the context (413) cannot be run: skipped and counted, as logged
        // traffic holds such records. Anything else is a broken file: stop and say which record.
        if (err.http_status() == 413) {
          if (too_long++ == 0) first_too_long = line_no;
          continue;
        }
        const std::string at = o.calib_file + ":" + std::to_string(line_no);
        throw Error(err.status(), err.type(), err.message(), err.where().empty() ? at : at + ": " + err.where());
      }
      if (group.size() == 8) run_group();
    }
    if (!group.empty()) run_group();
  } catch (...) {
    status.end();  // the progress line ends before the error
    throw;
  }
  engine->observe_linear_inputs(nullptr);
  if (o.progress && n > 0) status.done("quantize: calibration " + std::to_string(n) + " records");
  else status.end();
  if (too_long)
    std::fprintf(stderr, "quantize: skipped %zu calibration record(s) over the model's context (the first at %s:%zu)\n", too_long,
                 o.calib_file.c_str(), first_too_long);
  if (n == 0) throw load_error(o.calib_file, "no calibration records" + std::string(too_long ? " that fit the context" : ""));
  return cal;
}

}  // namespace

void quantize(const QuantizeOptions& o) {
  const bool nvfp4 = o.scheme == "nvfp4" || o.scheme == "nvfp4-w4a16", w4a4 = o.scheme == "nvfp4";
  if (!nvfp4 && o.scheme != "fp8") throw Error(Status::BadRequest, "usage", "--scheme " + o.scheme + ": nvfp4, nvfp4-w4a16 or fp8");
  if (w4a4 && o.calib_file.empty())
    throw Error(Status::BadRequest, "usage", "--scheme nvfp4 (W4A4) needs --calib FILE.jsonl: its activation scales are calibrated");
  const model::ModelConfig cfg = model::load_config(o.model_dir);
  if (cfg.quantization) throw load_error(o.model_dir + "/config.json", "the folder is already quantized; quantize a bf16 folder");
  if (fs::exists(o.out_dir) && !fs::is_empty(o.out_dir)) throw Error(Status::BadRequest, "usage", "--out " + o.out_dir + " exists and is not empty");
  // the outermost folder this run makes (--out new/a/b makes new), empty if --out exists
  fs::path made;
  for (fs::path p = fs::absolute(o.out_dir); !p.empty() && !fs::exists(p); p = p.parent_path()) {
    made = p;
    if (p == p.parent_path()) break;
  }
  fs::create_directories(o.out_dir);
  // a failure leaves no half-written folder behind: the folders this run made, else what it
  // wrote into the empty one it was given (no exception leaves the destructor)
  struct Cleanup {
    const fs::path dir, made;
    bool armed = true;
    ~Cleanup() {
      if (!armed) return;
      std::error_code ec;
      if (!made.empty()) {
        fs::remove_all(made, ec);
        return;
      }
      std::vector<fs::path> written;
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) written.push_back(it->path());
      for (const fs::path& p : written) fs::remove_all(p, ec);
    }
  } cleanup{o.out_dir, made};

  // W4A4: calibrate the input activations of every Linear over the records.
  const Calibration cal = w4a4 ? calibrate(o) : Calibration{};

  io::TensorStore st = io::TensorStore::open_folder(o.model_dir);
  std::vector<const io::TensorInfo*> all = st.all();
  // shared global scales: the largest amax of each group
  std::map<std::string, float> group_amax;
  for (const io::TensorInfo* t : all)
    if (quantized_linear(*t, nvfp4)) {
      auto w = model::to_f32(*t);
      float m = 0;
      for (float v : w) m = std::fmax(m, std::fabs(v));
      float& g = group_amax[quant::recipe_scale_group(t->name)];
      g = std::fmax(g, m);
    }
  std::map<std::string, std::vector<io::OutTensor>> shards;  // file name -> tensors
  std::set<std::string> ignored;  // Linear modules of the decoder kept in bf16
  Value weight_map = Value::object();
  size_t done = 0;
  StatusLine tensors_line;
  for (const io::TensorInfo* t : all) {
    const std::string file = fs::path(*t->file).filename().string();
    auto& out = shards[file];
    ++done;
    if (o.progress && done % 16 == 0) tensors_line.update("quantize: " + std::to_string(done) + "/" + std::to_string(all.size()) + " tensors");
    if (!quantized_linear(*t, nvfp4)) {
      out.push_back({t->name, t->dtype, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes)});
      if (ends_with(t->name, ".weight") && t->shape.size() == 2 && t->name.rfind("model.language_model.layers.", 0) == 0)
        ignored.insert(t->name.substr(0, t->name.size() - 7));
      continue;
    }
    const std::string base = t->name.substr(0, t->name.size() - 7);
    auto w = model::to_f32(*t);
    const int64_t rows = t->shape[0], cols = t->shape[1];
    if (nvfp4) {
      const float amax = group_amax[quant::recipe_scale_group(t->name)];
      const float gs = amax > 0 && std::isfinite(amax) ? 448.0f * 6.0f / amax : 1.0f;
      quant::Nvfp4Weight q = quant::nvfp4_quantize(w.data(), rows, cols, gs);
      out.push_back({base + ".weight_packed", io::DType::U8, {rows, cols / 2}, std::move(q.packed)});
      out.push_back({base + ".weight_scale", io::DType::F8_E4M3, {rows, cols / 16}, std::move(q.scales)});
      out.push_back({base + ".weight_global_scale", io::DType::F32, {1}, io::f32_bytes({q.global_scale})});
      if (w4a4) {
        auto it = cal.amax.find(base);
        const float a = it == cal.amax.end() ? 0.0f : it->second;
        out.push_back({base + ".input_global_scale", io::DType::F32, {1}, io::f32_bytes({a > 0 ? 448.0f * 6.0f / a : 1.0f})});
      }
    } else {  // fp8, per output channel
      std::vector<uint8_t> codes(w.size());
      std::vector<float> scale(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        float m = 0;
        for (int64_t c = 0; c < cols; ++c) m = std::fmax(m, std::fabs(w[size_t(r * cols + c)]));
        const float s = m > 0 ? m / 448.0f : 1.0f;
        scale[size_t(r)] = s;
        for (int64_t c = 0; c < cols; ++c) codes[size_t(r * cols + c)] = quant::e4m3_encode(w[size_t(r * cols + c)] / s);
      }
      out.push_back({base + ".weight", io::DType::F8_E4M3, {rows, cols}, std::move(codes)});
      out.push_back({base + ".weight_scale", io::DType::F32, {rows, 1}, io::f32_bytes(scale)});
    }
  }
  if (o.progress) tensors_line.done("quantize: " + std::to_string(all.size()) + " tensors");
  for (auto& [file, tensors] : shards) {
    io::write_safetensors((fs::path(o.out_dir) / file).string(), tensors);
    for (const auto& t : tensors) weight_map.add(t.name, Value::string(file));
  }
  Value index = Value::object();
  index.add("metadata", Value::object());
  index.add("weight_map", weight_map);
  std::ofstream(fs::path(o.out_dir) / "model.safetensors.index.json") << json::write(index) << "\n";
  // everything else (tokenizer, joint head, processor configs) as is
  for (const auto& e : fs::directory_iterator(o.model_dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name == "model.safetensors.index.json" || shards.count(name)) continue;
    fs::copy_file(e.path(), fs::path(o.out_dir) / name, fs::copy_options::overwrite_existing);
  }
  Value root = json::parse(read_file(o.model_dir + "/config.json"));
  Value weights = Value::object(), acts = Value::null();
  if (nvfp4) {
    weights = json::parse(R"({"num_bits":4,"type":"float","strategy":"tensor_group","group_size":16,"symmetric":true,"dynamic":false,"scale_dtype":"torch.float8_e4m3fn"})");
    if (w4a4)
      acts = json::parse(R"({"num_bits":4,"type":"float","strategy":"tensor_group","group_size":16,"symmetric":true,"dynamic":"local","observer":"static_minmax"})");
  } else {
    weights = json::parse(R"({"num_bits":8,"type":"float","strategy":"channel","symmetric":true,"dynamic":false})");
    acts = json::parse(R"({"num_bits":8,"type":"float","strategy":"token","symmetric":true,"dynamic":true})");
  }
  Value group = Value::object();
  Value targets = Value::array();
  targets.arr.push_back(Value::string("Linear"));
  group.add("targets", targets);
  group.add("weights", weights);
  group.add("input_activations", acts);
  Value groups = Value::object();
  groups.add("group_0", group);
  Value ignore = Value::array();
  ignore.arr.push_back(Value::string("lm_head"));
  for (const auto& m : ignored) ignore.arr.push_back(Value::string(m.substr(std::string("model.").size())));
  Value qc = Value::object();
  qc.add("quant_method", Value::string("compressed-tensors"));
  qc.add("format", Value::string(nvfp4 ? "nvfp4-pack-quantized" : "float-quantized"));
  qc.add("quantization_status", Value::string("compressed"));
  qc.add("config_groups", groups);
  qc.add("ignore", ignore);
  root.add("quantization_config", qc);
  std::ofstream(fs::path(o.out_dir) / "config.json") << json::write(root) << "\n";
  cleanup.armed = false;
}

}  // namespace clefrt
