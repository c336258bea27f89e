// RGB8 pixels -> PNG bytes through libpng (benchmark and test images: the protocol only decodes).
#pragma once
#include <cstdint>
#include <string>

namespace clefrt {

std::string encode_png_rgb(const uint8_t* rgb, uint32_t width, uint32_t height);

// A smooth width x height RGB image (gradients and rings: it compresses well, so a 16 MP one
// stays within the protocol's 4 MiB per image), as PNG bytes.
std::string synthetic_png(uint32_t width, uint32_t height);

}  // namespace clefrt
