// Whole-file reads with errors that name the file.
#pragma once
#include <string>

namespace clefrt {

// The file's bytes; throws load_error("PATH: cannot open") when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace clefrt
