// RGB8 pixels -> PNG bytes through libpng (benchmark and test images: the protocol only decodes).
#pragma once
#include <cstdint>
#include <string>

namespace clefrt {

std::string encode_png_rgb(const uint8_t* rgb, uint32_t width, uint32_t height);

// A width x height RGB image of gradients and checks, as PNG bytes: it compresses well, so four
// 16 MP ones stay within the protocol's 4 MiB per image and 8 MiB per request.
std::string synthetic_png(uint32_t width, uint32_t height);

}  // namespace clefrt
