#include "image/decode.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <new>

#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

#include "common/error.h"

namespace clefrt {
namespace {

void check_pixels(uint64_t w, uint64_t h, uint64_t max_pixels, const std::string& where) {
  if (w == 0 || h == 0) throw unprocessable(where, "the image has no pixels (" + std::to_string(w) + "x" + std::to_string(h) + ")");
  if (w * h > max_pixels)
    throw unprocessable(where, "the image has " + std::to_string(w * h) + " pixels (" + std::to_string(w) + "x" + std::to_string(h) +
                                   "); the limit is " + std::to_string(max_pixels));
}

// libpng and libjpeg report errors through callbacks that must not return: they longjmp back to
// the decoder, which then throws (no C++ exception crosses the C libraries).
struct PngReader {
  std::string_view data;
  size_t pos = 0;
  char message[200] = "";
};

void png_read_cb(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (r->data.size() - r->pos < n) png_error(png, "the PNG data ends early");
  std::memcpy(out, r->data.data() + r->pos, n);
  r->pos += n;
}

void png_error_cb(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof r->message, "%s", msg);
  png_longjmp(png, 1);
}

void png_warning_cb(png_structp, png_const_charp) {}

RgbImage decode_png(std::string_view bytes, uint64_t max_pixels, const std::string& where) {
  PngReader reader{bytes};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, png_error_cb, png_warning_cb);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    throw std::bad_alloc();
  }
  RgbImage img;
  std::vector<png_bytep> rows;
  std::string refused;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw unprocessable(where, refused.empty() ? std::string("the PNG does not decode: ") + reader.message : refused);
  }
  png_set_read_fn(png, &reader, png_read_cb);
  png_read_info(png, info);
  png_uint_32 w = 0, h = 0;
  int depth = 0, color = 0, interlace = 0;
  png_get_IHDR(png, info, &w, &h, &depth, &color, &interlace, nullptr, nullptr);
  if (uint64_t(w) * h > max_pixels || w == 0 || h == 0) {
    png_destroy_read_struct(&png, &info, nullptr);
    check_pixels(w, h, max_pixels, where);
  }
  if (depth == 16) {
    // torchvision decodes these to uint16 and the processor's resize then fails: there is no
    // reference answer to match, so say so instead of inventing a conversion.
    refused = "16-bit PNGs are not supported (the reference processor cannot resize them); save it with 8 bits per channel";
    png_error(png, "16-bit");
  }
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);  // tRNS ignored: RGB mode drops alpha
  if ((color & PNG_COLOR_MASK_COLOR) == 0) {
    if (depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    png_set_gray_to_rgb(png);
  }
  // libpng's palette / gray expansion turns a tRNS chunk into alpha: strip that too
  if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != size_t(w) * 3) {
    refused = "the PNG's colour type could not be converted to 8-bit RGB";
    png_error(png, "rowbytes");
  }
  img.width = w;
  img.height = h;
  img.pixels.resize(size_t(w) * h * 3);
  rows.resize(h);
  for (png_uint_32 y = 0; y < h; ++y) rows[y] = img.pixels.data() + size_t(y) * w * 3;
  png_read_image(png, rows.data());
  png_destroy_read_struct(&png, &info, nullptr);
  return img;
}

struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = "";
};

void jpeg_error_cb(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegError*>(c->err);
  (*c->err->format_message)(c, e->message);
  longjmp(e->jump, 1);
}

void jpeg_silent(j_common_ptr, int) {}

// torchvision's CMYK -> RGB (Adobe JPEGs store inverted CMYK): channel = k * c / 255 with
// Pillow's rounding division, on the stored values.
uint8_t cmyk_channel(int k, int c) {
  const int t = k * (255 - c) + 128;
  const int v = ((t >> 8) + t) >> 8;
  const int r = k - v;
  return uint8_t(r < 0 ? 0 : r > 255 ? 255 : r);
}

RgbImage decode_jpeg(std::string_view bytes, uint64_t max_pixels, const std::string& where) {
  jpeg_decompress_struct cinfo{};
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_cb;
  err.mgr.emit_message = jpeg_silent;
  RgbImage img;
  std::vector<uint8_t> line;
  std::string refused;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw unprocessable(where, refused.empty() ? std::string("the JPEG does not decode: ") + err.message : refused);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (uint64_t(cinfo.image_width) * cinfo.image_height > max_pixels) {
    const uint64_t w = cinfo.image_width, h = cinfo.image_height;
    jpeg_destroy_decompress(&cinfo);
    check_pixels(w, h, max_pixels, where);
  }
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const uint32_t w = cinfo.output_width, h = cinfo.output_height;
  img.width = w;
  img.height = h;
  img.pixels.resize(size_t(w) * h * 3);
  line.resize(size_t(w) * (cmyk ? 4 : 3));
  while (cinfo.output_scanline < h) {
    const uint32_t y = cinfo.output_scanline;
    JSAMPROW row = line.data();
    jpeg_read_scanlines(&cinfo, &row, 1);
    uint8_t* out = img.pixels.data() + size_t(y) * w * 3;
    if (!cmyk) {
      std::memcpy(out, line.data(), size_t(w) * 3);
    } else {
      for (uint32_t x = 0; x < w; ++x) {
        const uint8_t* p = line.data() + size_t(x) * 4;
        for (int c = 0; c < 3; ++c) out[x * 3 + c] = cmyk_channel(p[3], p[c]);
      }
    }
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return img;
}

RgbImage decode_webp(std::string_view bytes, uint64_t max_pixels, const std::string& where) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  WebPBitstreamFeatures f;
  if (WebPGetFeatures(data, bytes.size(), &f) != VP8_STATUS_OK) throw unprocessable(where, "the WebP header does not decode");
  if (f.has_animation) throw unprocessable(where, "animated WebP images are not supported");
  check_pixels(uint64_t(f.width), uint64_t(f.height), max_pixels, where);
  RgbImage img;
  img.width = uint32_t(f.width);
  img.height = uint32_t(f.height);
  img.pixels.resize(size_t(img.width) * img.height * 3);
  // RGB output: the alpha channel is dropped, as torchvision's RGB mode does
  if (!WebPDecodeRGBInto(data, bytes.size(), img.pixels.data(), img.pixels.size(), int(img.width) * 3))
    throw unprocessable(where, "the WebP data does not decode");
  return img;
}

}  // namespace

RgbImage decode_image(ImageFormat format, std::string_view bytes, uint64_t max_pixels, const std::string& where) {
  switch (format) {
    case ImageFormat::Png: return decode_png(bytes, max_pixels, where);
    case ImageFormat::Jpeg: return decode_jpeg(bytes, max_pixels, where);
    case ImageFormat::Webp: return decode_webp(bytes, max_pixels, where);
  }
  throw unprocessable(where, "unknown image format");
}

}  // namespace clefrt
