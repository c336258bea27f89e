#include "image/png_write.h"

#include <png.h>

#include <algorithm>
#include <vector>

#include "common/error.h"

namespace clefrt {

std::string encode_png_rgb(const uint8_t* rgb, uint32_t width, uint32_t height) {
  png_image im{};
  im.version = PNG_IMAGE_VERSION;
  im.width = width;
  im.height = height;
  im.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&im, nullptr, &size, 0, rgb, 0, nullptr))
    throw Error(Status::Internal, "internal_error", std::string("encode_png_rgb: ") + im.message);
  std::string out(size_t(size), '\0');
  if (!png_image_write_to_memory(&im, out.data(), &size, 0, rgb, 0, nullptr))
    throw Error(Status::Internal, "internal_error", std::string("encode_png_rgb: ") + im.message);
  out.resize(size_t(size));
  png_image_free(&im);
  return out;
}

std::string synthetic_png(uint32_t width, uint32_t height) {
  std::vector<uint8_t> px(size_t(width) * height * 3);
  for (uint32_t y = 0; y < height; ++y)
    for (uint32_t x = 0; x < width; ++x) {
      uint8_t* p = px.data() + (size_t(y) * width + x) * 3;
      p[0] = uint8_t(255.0 * x / std::max(1u, width - 1));
      p[1] = uint8_t(255.0 * y / std::max(1u, height - 1));
      p[2] = ((x >> 5) ^ (y >> 5)) & 1 ? 200 : 60;  // 32-pixel checks: edges for the resize to smooth
    }
  return encode_png_rgb(px.data(), width, height);
}

}  // namespace clefrt
