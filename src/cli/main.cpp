// clefrt: a runtime for joint-schema decision models (Clef, Clef-flash and fine-tunes).
#include <cstdlib>
#include <iostream>

#include "cli/commands.h"
#include "common/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "clefrt " CLEFRT_VERSION
      ": run joint-schema decision models (Cloudflare's Clef and Clef-flash).\n"
      "A request holds a state and typed questions (noul, choice, score); the model returns a\n"
      "probability for every allowed option in one forward pass."};
  app.require_subcommand(1);
  app.set_version_flag("--version", clefrt::version());
  std::vector<std::pair<std::string, clefrt::cli::Runner>> runners = {
      {"encode", clefrt::cli::add_encode(app)},
      {"decide", clefrt::cli::add_decide(app)},
      {"synth", clefrt::cli::add_synth(app)},
      {"inspect", clefrt::cli::add_inspect(app)},
      {"bench", clefrt::cli::add_bench(app)},
      {"serve", clefrt::cli::add_serve(app)},
      {"quantize", clefrt::cli::add_quantize(app)},
      {"eval", clefrt::cli::add_eval(app)},
  };
  // after the commands: a subcommand made earlier would inherit the footer into its own --help
  app.footer(
      "Run `clefrt COMMAND --help` for a command's options.\n"
      "Exit status: 0 done; 1 some request was refused or failed (its error JSON printed in its place), or\n"
      "serve's model failed to load after it listened; 2 the command could not run (usage, model folder,\n"
      "device); 104-114 a flag or its value was refused while reading them.\n"
      "Missed targets are in the README; a long request's GPU step does not yield to others inside it.\n"
      "Untested: the native Blackwell FP4 path.");
  // a word where the command goes that names none: say so (CLI11 would only say one is required)
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (auto& [name, run] : runners) {
      known = known || name == argv[1];
      names += (names.empty() ? "" : ", ") + name;
    }
    if (!known) {
      std::cerr << "clefrt: unknown command '" << argv[1] << "' (commands: " << names << "; clefrt --help explains them)\n";
      return static_cast<int>(CLI::ExitCodes::ExtrasError);
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    // a value refused for an option that is not on the command line came from its environment
    // variable (CLEFRT_<NAME>, services' environment files): say which
    const std::string what = e.what();
    if (const size_t at = what.find("--"); at != std::string::npos) {
      const std::string flag = what.substr(at, what.find_first_of(" :=", at) - at);
      bool given = false;
      for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        given = given || a == flag || a.rfind(flag + "=", 0) == 0;
      }
      // the option's own environment name (add_env_names' CLEFRT_<NAME>, or one set by hand)
      std::string env;
      for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
        if (const CLI::Option* op = sub->get_option_no_throw(flag); op && env.empty()) env = op->get_envname();
      if (!given && !env.empty() && std::getenv(env.c_str()))
        std::cerr << "(" << flag << "'s value came from the environment: " << env << "=" << std::getenv(env.c_str()) << ")\n";
    }
    return rc;
  }
  try {
    for (auto& [name, run] : runners)
      if (app.got_subcommand(name)) return run();
  } catch (const clefrt::Error& e) {
    std::cerr << "clefrt: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "clefrt: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
