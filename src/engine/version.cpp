// clefrt::version(): what `clefrt --version`, the server's ready line and /health report: the
// release, the commit it was built from (build_info.h, written at every build by
// tools/build_info.cmake), the build type, and for a CUDA build the toolkit and the GPU
// architectures compiled in (a GPU outside them cannot run this build).
#include <clefrt/clefrt.h>

#include "build_info.h"

namespace clefrt {

std::string version() {
  std::string v = std::string("clefrt ") + CLEFRT_VERSION + " (commit " CLEFRT_COMMIT ", " CLEFRT_BUILD_TYPE " build; ";
#ifdef CLEFRT_HAVE_CUDA
  v += "CUDA " CLEFRT_CUDA_TOOLKIT ", architectures " CLEFRT_CUDA_ARCHS ")";
#else
  v += "CPU only: built without CUDA)";
#endif
  return v;
}

const char* cuda_build_architectures() {
#ifdef CLEFRT_HAVE_CUDA
  return CLEFRT_CUDA_ARCHS;
#else
  return "";
#endif
}

}  // namespace clefrt
