// libclefrt.so's own translation unit: the library is clefrt_core linked whole (CMake needs a
// source per library); this names the version the shared object was built as.
#include <clefrt/clefrt.h>

namespace clefrt {
extern "C" const char* clefrt_shared_library_version() { return CLEFRT_VERSION; }
}  // namespace clefrt
