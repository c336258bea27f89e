// The public C++ API from outside the project: built against include/ and the shared library
// alone (libclefrt.so), as an installed copy would be used:
//   c++ -std=c++17 api_decide.cpp -I PREFIX/include -L PREFIX/lib -lclefrt
// Usage: api_decide MODEL_DIR REQUEST.json  (prints the System One response)
//        api_decide --synthesize DIR TOKENIZER.json REQUEST.json  (writes a tiny random folder first)
#include <clefrt/clefrt.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 3 && argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL_DIR REQUEST.json | %s --synthesize DIR TOKENIZER.json REQUEST.json\n", argv[0], argv[0]);
    return 2;
  }
  try {
    std::string dir = argv[1], request = argv[2];
    if (argc == 5) {
      clefrt::SynthOptions so;
      so.out_dir = dir = argv[2];
      so.tokenizer = argv[3];
      so.progress = false;
      clefrt::synthesize(so);
      request = argv[4];
    }
    std::ifstream in(request);
    if (!in) {
      std::fprintf(stderr, "cannot read %s\n", request.c_str());
      return 2;
    }
    std::stringstream body;
    body << in.rdbuf();
    clefrt::EngineOptions opts;
    opts.device = clefrt::Device::Cpu;
    auto engine = clefrt::Engine::load(dir, opts);
    clefrt::Prepared req = engine->prepare(body.str());
    std::vector<clefrt::Probs> p = engine->probs({&req});
    std::printf("%s\n", req.answer(p[0], clefrt::AnswerOptions{}).c_str());
    // the same through decide()
    return engine->decide(body.str()) == req.answer(p[0], clefrt::AnswerOptions{}) ? 0 : 1;
  } catch (const clefrt::Error& e) {
    std::fprintf(stderr, "%s\n", e.to_json().c_str());
    return 1;
  }
}
