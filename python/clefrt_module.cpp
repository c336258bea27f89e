// The `clefrt._clefrt` extension: the public C++ API (include/clefrt/clefrt.h) for Python.
// python/clefrt/__init__.py builds the user-facing Clef class on it. The GIL is released
// whenever the engine works (preparing, forwards), so Python threads can share one engine.
#include <clefrt/clefrt.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

namespace py = pybind11;

namespace {

PyObject* g_request_error = nullptr;  // clefrt.RequestError (a ValueError): the caller's input
PyObject* g_load_error = nullptr;     // clefrt.LoadError (an OSError): a folder, file or tensor
PyObject* g_engine_error = nullptr;   // clefrt.EngineError (a RuntimeError): everything else

// An instance of cls carrying the Error's fields as attributes.
void raise(PyObject* cls, const clefrt::Error& e) {
  py::object inst = py::reinterpret_borrow<py::object>(cls)(e.what());
  inst.attr("status") = e.http_status();
  inst.attr("type") = e.type();
  inst.attr("path") = e.where();
  inst.attr("message") = e.message();
  PyErr_SetObject(cls, inst.ptr());
}

// An option's value of the type it needs, or a clear error naming the option: pybind11's own
// cast would turn "100" or 1.5 into a number and -1 into "Unable to cast Python instance".
std::string type_name(py::handle v) { return py::str(py::type::of(v).attr("__name__")); }
clefrt::Error option_error(const std::string& k, const std::string& what) { return clefrt::Error(clefrt::Status::BadRequest, "usage", k + " " + what); }
// v's integer value through __index__ (int, numpy ints; not float or text): false, with no
// Python error left set, when it has none; overflow: +1 / -1 past long long's range
bool index_value(py::handle v, long long& n, int& overflow) {
  PyObject* index = PyNumber_Index(v.ptr());
  if (!index) {
    PyErr_Clear();
    return false;
  }
  overflow = 0;
  n = PyLong_AsLongLongAndOverflow(index, &overflow);
  Py_DECREF(index);
  return true;
}
// An integer (int, numpy ints: anything with __index__; not bool, float or text) within
// [0, most]: the option named in the error, never pybind11's "Unable to cast".
long long int_option(const std::string& k, py::handle v, long long most) {
  long long n = 0;
  int overflow = 0;
  if (py::isinstance<py::bool_>(v) || !index_value(v, n, overflow)) throw option_error(k, "must be an int, not " + type_name(v));
  if (overflow > 0 || (overflow == 0 && n > most)) throw option_error(k, "must be at most " + std::to_string(most));
  if (overflow < 0 || n < 0) throw option_error(k, "must be 0 or more, not " + std::string(py::str(v)));
  return n;
}
size_t count_option(const std::string& k, py::handle v) { return size_t(int_option(k, v, (long long)(1) << 40)); }
// True / False, numpy bools, or the ints 0 and 1 (the values bool() took before); not text or
// other numbers, which would say nothing clear
bool flag_option(const std::string& k, py::handle v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  const std::string t = type_name(v);
  if (t == "bool_" || t == "bool") return PyObject_IsTrue(v.ptr()) == 1;  // numpy.bool_ / numpy.bool
  long long n = 0;
  int overflow = 0;
  if (index_value(v, n, overflow) && overflow == 0 && (n == 0 || n == 1)) return n == 1;
  throw option_error(k, "must be True or False, not " + std::string(py::str(py::repr(v))));
}
// a number of GiB: int, float, numpy numbers (anything float() takes that is not text or bool)
// A number of `unit` (GiB, milliseconds); the engine checks its range and names the option.
double number_option(const std::string& k, py::handle v, const std::string& unit) {
  if (py::isinstance<py::bool_>(v) || py::isinstance<py::str>(v) || py::isinstance<py::bytes>(v))
    throw option_error(k, "must be a number of " + unit + ", not " + type_name(v));
  PyObject* f = PyNumber_Float(v.ptr());
  if (!f) {
    PyErr_Clear();
    throw option_error(k, "must be a number of " + unit + ", not " + type_name(v));
  }
  const double d = PyFloat_AsDouble(f);
  Py_DECREF(f);
  return d;
}

clefrt::EngineOptions options_from(const py::dict& d) {
  clefrt::EngineOptions o;
  for (auto item : d) {
    const std::string k = py::str(item.first);
    const py::handle v = item.second;
    if (k == "device") {
      const std::string s = py::str(v);
      if (s != "auto" && s != "cpu" && s != "cuda") throw clefrt::Error(clefrt::Status::BadRequest, "usage", "device must be auto, cpu or cuda, not " + s);
      o.device = s == "cuda" ? clefrt::Device::Cuda : s == "cpu" ? clefrt::Device::Cpu : clefrt::Device::Auto;
    } else if (k == "mode") o.quant = clefrt::parse_quant_mode(py::str(v));
    else if (k == "offload_embeddings") o.offload_embeddings = flag_option(k, v);
    else if (k == "w4a16_fused") o.w4a16_fused = flag_option(k, v);
    else if (k == "native_fp4") o.native_fp4 = flag_option(k, v);
    else if (k == "portable_kernels") o.portable_kernels = flag_option(k, v);
    else if (k == "attention") o.attention = clefrt::parse_attention_kernel(py::str(v));
    else if (k == "vision") o.vision = flag_option(k, v);
    else if (k == "progress") o.progress = flag_option(k, v);
    else if (k == "threads") o.threads = int(int_option(k, v, 1 << 16));
    else if (k == "batch_invariant") o.batch_invariant = flag_option(k, v);
    else if (k == "check_weights") o.check_weights = flag_option(k, v);
    else if (k == "load_weights") o.load_weights = flag_option(k, v);
    else if (k == "max_length") o.max_length = count_option(k, v);
    else if (k == "parse_special") o.parse_special = flag_option(k, v);
    else if (k == "require_instructions") o.require_instructions = flag_option(k, v);
    else if (k == "max_batch_tokens") o.max_batch_tokens = count_option(k, v);
    else if (k == "max_batch_requests") o.max_batch_requests = count_option(k, v);
    else if (k == "max_queue") o.max_queue = count_option(k, v);
    else if (k == "batch_wait_ms") o.batch_wait_ms = number_option(k, v, "milliseconds");
    else if (k == "prefix_cache_gib") o.prefix_cache_gib = number_option(k, v, "GiB");
    else if (k == "prefix_cache_host_gib") o.prefix_cache_host_gib = number_option(k, v, "GiB");
    else if (k == "step_tokens") o.step_tokens = count_option(k, v);
    else if (k == "step_layers") o.step_layers = count_option(k, v);
    else if (k == "cuda_graphs") o.cuda_graphs = count_option(k, v);
    else if (k == "warmup") o.warmup = flag_option(k, v);
    else throw clefrt::Error(clefrt::Status::BadRequest, "usage", "unknown engine option '" + k + "'");
  }
  return o;
}

clefrt::AnswerOptions answer_options(const std::string& confidence, bool precise) {
  clefrt::AnswerOptions a;
  a.confidence = clefrt::parse_confidence(confidence);
  a.precise = precise;
  return a;
}

py::dict span(const clefrt::Span& s) {
  py::dict d;
  d["begin"] = s.begin;
  d["end"] = s.end;
  return d;
}

}  // namespace

PYBIND11_MODULE(_clefrt, m) {
  m.doc() = "clefrt's C++ engine (use the clefrt package, not this module)";
  g_request_error = PyErr_NewExceptionWithDoc("clefrt.RequestError",
                                              "A request that is malformed, breaks a limit or does not fit (HTTP 400 / 413 / 422). "
                                              "Attributes: status, type, path (the JSON path at fault), message.",
                                              PyExc_ValueError, nullptr);
  g_load_error = PyErr_NewExceptionWithDoc("clefrt.LoadError",
                                           "A model folder that cannot be loaded. Attributes: status, type, path (the file or tensor), message.",
                                           PyExc_OSError, nullptr);
  g_engine_error = PyErr_NewExceptionWithDoc("clefrt.EngineError",
                                             "A failure of the engine itself (non-finite values, a missing GPU, a stopped engine). "
                                             "Attributes: status, type, path, message.",
                                             PyExc_RuntimeError, nullptr);
  m.attr("RequestError") = py::handle(g_request_error);
  m.attr("LoadError") = py::handle(g_load_error);
  m.attr("EngineError") = py::handle(g_engine_error);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const clefrt::Error& e) {
      const int s = e.http_status();
      if (e.type() == "load_error") raise(g_load_error, e);
      else if (s == 400 && e.type() == "usage") {
        PyErr_SetString(PyExc_ValueError, e.what());
      } else if (s == 400 || s == 413 || s == 422) raise(g_request_error, e);
      else raise(g_engine_error, e);
    }
  });

  py::class_<clefrt::Prepared>(m, "Prepared", "A request parsed, validated and encoded (see Clef.encode).")
      .def_property_readonly("input_ids", [](const clefrt::Prepared& p) { return p.encoded().input_ids; })
      .def_property_readonly("questions",
                             [](const clefrt::Prepared& p) {
                               py::list out;
                               for (const auto& q : p.encoded().questions) {
                                 py::dict d;
                                 d["id"] = q.id;
                                 d["type"] = clefrt::type_name(q.type);
                                 d["question_span"] = span(q.question_span);
                                 py::list spans;
                                 for (const auto& s : q.option_spans) spans.append(span(s));
                                 d["option_spans"] = spans;
                                 d["option_ids"] = q.option_ids;
                                 out.append(d);
                               }
                               return out;
                             })
      .def_property_readonly("state_span", [](const clefrt::Prepared& p) { return span(p.encoded().state_span); })
      .def_property_readonly("state_tokens_dropped", [](const clefrt::Prepared& p) { return p.encoded().state_tokens_dropped; })
      .def_property_readonly("input_tokens", &clefrt::Prepared::input_tokens)
      .def("encoded_json", &clefrt::Prepared::encoded_json)
      .def("answer", [](const clefrt::Prepared& p, const std::vector<std::vector<double>>& probs, const std::string& confidence, bool precise,
                        const std::string& model, size_t cached_tokens) {
        return p.answer(probs, answer_options(confidence, precise), model, cached_tokens);
      });

  py::class_<clefrt::Engine>(m, "Engine", "clefrt::Engine")
      .def(py::init([](const std::string& path, const py::dict& opts) {
             const clefrt::EngineOptions o = options_from(opts);
             py::gil_scoped_release nogil;
             return clefrt::Engine::load(path, o);
           }),
           py::arg("path"), py::arg("options"))
      .def("prepare",
           [](const clefrt::Engine& e, const std::string& body, bool decisions_shape) {
             py::gil_scoped_release nogil;
             return e.prepare(body, decisions_shape ? clefrt::BodyShape::Decisions : clefrt::BodyShape::SystemOne);
           })
      .def("probs",
           [](clefrt::Engine& e, const std::vector<const clefrt::Prepared*>& reqs) {
             py::gil_scoped_release nogil;
             return e.probs(reqs);
           })
      .def("probs_and_cached",
           [](clefrt::Engine& e, const std::vector<const clefrt::Prepared*>& reqs) {
             std::vector<size_t> cached;
             std::vector<clefrt::Probs> p;
             {
               py::gil_scoped_release nogil;
               p = e.probs(reqs, &cached);
             }
             return py::make_tuple(p, cached);
           })
      .def_property_readonly("prefix_cache",
                             [](const clefrt::Engine& e) {
                               const clefrt::PrefixCacheStats s = e.prefix_cache();
                               py::dict d;
                               d["enabled"] = s.enabled;
                               d["budget_bytes"] = s.budget_bytes;
                               d["granularity"] = s.granularity;
                               d["bytes"] = s.bytes;
                               d["entries"] = s.entries;
                               d["hits"] = s.hits;
                               d["misses"] = s.misses;
                               d["hit_tokens"] = s.hit_tokens;
                               d["inserted"] = s.inserted;
                               d["evictions"] = s.evictions;
                               d["too_large"] = s.too_large;
                               d["host_budget_bytes"] = s.host_budget_bytes;
                               d["host_bytes"] = s.host_bytes;
                               d["host_entries"] = s.host_entries;
                               d["host_hits"] = s.host_hits;
                               d["host_hit_tokens"] = s.host_hit_tokens;
                               d["to_host"] = s.to_host;
                               d["host_evictions"] = s.host_evictions;
                               return d;
                             })
      .def("decide",
           [](clefrt::Engine& e, const std::string& body, const std::string& confidence, bool precise) {
             const clefrt::AnswerOptions a = answer_options(confidence, precise);
             py::gil_scoped_release nogil;
             return e.decide(body, a);
           })
      .def_property_readonly("device", [](const clefrt::Engine& e) { return std::string(clefrt::device_name(e.device())); })
      .def_property_readonly("format", [](const clefrt::Engine& e) { return std::string(e.format()); })
      .def_property_readonly("gpu_bytes", &clefrt::Engine::gpu_bytes)
      .def_property_readonly("summary", &clefrt::Engine::summary)
      .def_property_readonly("max_length", &clefrt::Engine::max_length)
      .def("stop", [](clefrt::Engine& e) {
        py::gil_scoped_release nogil;
        e.stop();
      });

  m.def("version", &clefrt::version);
  m.def("cuda_available", [] {
    std::string why;
    const bool ok = clefrt::cuda_available(&why);
    return py::make_tuple(ok, why);
  });
}
