// `clefrt encode`: a request -> token ids and spans, with no weights needed.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <unistd.h>

#include "cli/commands.h"

namespace clefrt::cli {

namespace fs = std::filesystem;

namespace {
Error unreadable(const std::string& in) {  // errno: the failed open's / access's reason
  return Error(Status::BadRequest, "io_error", std::string("cannot read the request file: ") + std::strerror(errno), in);
}
}  // namespace

void check_request_files(const std::vector<std::string>& inputs) {
  for (const auto& in : inputs) {
    if (in == "-") continue;
    std::error_code ec;
    if (fs::is_directory(in, ec)) throw Error(Status::BadRequest, "io_error", "is a folder, not a request file", in);
    // access(), not open(): opening a named pipe to test it would take what its writer sends
    if (access(in.c_str(), R_OK) != 0) throw unreadable(in);
  }
}

void for_each_record(const std::vector<std::string>& inputs, bool stdin_jsonl,
                     const std::function<void(const std::string&, const std::string&)>& fn) {
  for (const auto& in : inputs) {
    std::string text;
    if (in == "-") {
      std::stringstream ss;
      ss << std::cin.rdbuf();
      text = ss.str();
    } else {
      std::ifstream f(in, std::ios::binary);
      if (!f) throw unreadable(in);
      std::stringstream ss;
      ss << f.rdbuf();
      text = ss.str();
    }
    bool jsonl = (in == "-") ? stdin_jsonl : fs::path(in).extension() == ".jsonl";
    if (!jsonl) {
      fn(text, in);
      continue;
    }
    size_t line_no = 0, pos = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      ++line_no;
      std::string line = text.substr(pos, nl - pos);
      pos = nl + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      fn(line, in + ":" + std::to_string(line_no));
    }
  }
}

void hint_json_lines(const Error& e, const std::string& body, const std::string& where) {
  if (e.message().rfind("malformed JSON", 0) != 0) return;
  // lines that hold a whole object: '{' first and '}' last (a JSON-lines record is one line, so
  // it never counts two)
  size_t records = 0;
  for (size_t at = 0; at < body.size();) {
    size_t nl = body.find('\n', at);
    if (nl == std::string::npos) nl = body.size();
    const size_t first = body.find_first_not_of(" \t\r", at), last = body.find_last_not_of(" \t\r", nl - 1);
    if (first < nl && last != std::string::npos && last >= first && body[first] == '{' && body[last] == '}') ++records;
    at = nl + 1;
  }
  if (records > 1)
    std::cerr << "  (" << where << " looks like JSON lines, one request per line: name it .jsonl, or pass --jsonl when it is stdin)\n";
}

int print_each_record(const std::vector<std::string>& inputs, bool stdin_jsonl, const char* command,
                      const std::function<std::string(const std::string&)>& answer) {
  int status = 0;
  for_each_record(inputs, stdin_jsonl, [&](const std::string& body, const std::string& where) {
    try {
      std::cout << answer(body) << "\n";
    } catch (const Error& e) {
      std::cout << e.to_json() << "\n";
      std::cerr << "clefrt " << command << ": " << where << ": " << e.http_status() << " " << e.what() << "\n";
      hint_json_lines(e, body, where);
      status = 1;
    }
  });
  std::cout.flush();
  return status;
}

Runner add_encode(CLI::App& app) {
  struct Opts {
    std::string tokenizer, model;
    bool parse_special = false, require_instructions = false, jsonl = false;
    size_t max_length = 16384;
    std::vector<std::string> inputs;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* c = app.add_subcommand("encode",
                                   "Encode requests into the model's token ids and spans (no weights needed).\n"
                                   "Prints one JSON object per request: input_ids, per-question spans and option ids, usage.\n"
                                   "An invalid request prints the protocol's error JSON and the exit status is 1.");
  auto* tok = c->add_option("--tokenizer", o->tokenizer, "a Hugging Face tokenizer.json (byte-level BPE)")->check(CLI::ExistingFile);
  auto* model = c->add_option("--model", o->model, "a Clef release folder (reads tokenizer.json and preprocessor_config.json)")
                    ->check(CLI::ExistingDirectory);
  tok->excludes(model);
  c->add_flag("--parse-special", o->parse_special,
              "parse special-token text inside user content as special tokens, as the reference does\n"
              "(byte-exact parity; allows prompt injection). Default: user text is plain text.");
  c->add_flag("--require-instructions", o->require_instructions,
              "refuse a question whose instructions are missing or empty (422), as hosted Clef does;\n"
              "default: fall back to the question id, as the reference does");
  c->add_option("--max-length", o->max_length, "context length in tokens, at most 65536; the state is cut to fit (default 16384)")
      ->check(max_length_range());
  c->add_flag("--jsonl", o->jsonl, "read stdin ('-') as JSON lines, one request per line");
  c->add_option("requests", o->inputs, "request files (.json, or .jsonl for one per line); '-' reads stdin")->required();

  return [o]() -> int {
    if (o->tokenizer.empty() && o->model.empty())
      throw Error(Status::BadRequest, "usage", "encode needs --tokenizer FILE or --model DIR");
    EngineOptions eo;
    eo.max_length = o->max_length;
    eo.parse_special = o->parse_special;
    eo.require_instructions = o->require_instructions;
    eo.load_weights = false;
    auto engine = o->model.empty() ? Engine::tokenizer_only(o->tokenizer, eo) : Engine::load(o->model, eo);
    return print_each_record(o->inputs, o->jsonl, "encode",
                             [&](const std::string& body) { return engine->prepare(body).encoded_json(); });
  };
}

}  // namespace clefrt::cli
