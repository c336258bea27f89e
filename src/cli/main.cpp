// clefrt: a runtime for joint-schema decision models (Clef, Clef-flash and fine-tunes).
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
  app.set_version_flag("--version", "clefrt " CLEFRT_VERSION);
  app.footer(
      "Run `clefrt COMMAND --help` for a command's options.\n"
      "Not built yet (see README): decide, serve, inspect, synth, bench, quantize, eval.");
  std::vector<clefrt::cli::Runner> runners;
  auto encode = clefrt::cli::add_encode(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (app.got_subcommand("encode")) return encode();
  } catch (const clefrt::Error& e) {
    std::cerr << "clefrt: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "clefrt: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
