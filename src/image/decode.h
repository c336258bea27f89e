// Image bytes -> 8-bit RGB pixels, as the reference processor gets them from a data URL:
// transformers 5.17's torchvision backend calls torchvision.io.decode_image(mode=RGB), so
// alpha is dropped (never composited), gray and palettes are expanded, EXIF orientation is
// NOT applied, and 16-bit PNGs fail there (refused here with a clear error).
// docs/notes/image-processor-reference.md records what was measured.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "schema/request.h"

namespace clefrt {

struct RgbImage {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> pixels;  // height x width x 3, row-major
};

// Throws unprocessable(where, why) for data that does not decode, formats the reference
// refuses (16-bit PNG) or that clefrt does not take (CMYK / YCCK JPEG), and images over
// max_pixels (checked from the header, before any pixel memory is allocated).
RgbImage decode_image(ImageFormat format, std::string_view bytes, uint64_t max_pixels, const std::string& where);

}  // namespace clefrt
