// Image inputs: base64 decoding, format sniffing and header-only size reading (PNG, JPEG,
// WebP). Pixels are decoded by the vision stage, not here.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "schema/request.h"

namespace clefrt {

// Strict RFC 4648 base64 (padding optional, whitespace not allowed). nullopt on bad input.
std::optional<std::string> base64_decode(std::string_view s, size_t max_decoded);
// RFC 4648 base64 with padding (test and benchmark requests; the protocol only decodes).
std::string base64_encode(std::string_view bytes);

// Reads the pixel size from the file header. Returns false when the header is not a valid
// PNG/JPEG/WebP header of the given format.
bool image_size(ImageFormat fmt, std::string_view bytes, uint32_t& width, uint32_t& height);

// Sniffs the format from magic bytes.
std::optional<ImageFormat> sniff_image(std::string_view bytes);
const char* image_mime(ImageFormat f);

}  // namespace clefrt
