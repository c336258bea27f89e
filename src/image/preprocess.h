// The image processor (spec/model.md 2 step 1), exactly as the reference runs it on the CPU:
// transformers 5.17's Qwen2VLImageProcessor (torchvision backend) = smart resize, ATen's uint8
// bicubic antialiased resize (integer weights, width pass first), (x - 127.5) / 127.5 in fp32,
// patches in merge-block order with the still image repeated to 2 frames.
#pragma once
#include <cstdint>
#include <string>

#include "image/decode.h"
#include "model/vision.h"
#include "schema/encode.h"

namespace clefrt {

// ATen's `interpolate(uint8, mode="bicubic", antialias=True)` on the CPU; a side whose size
// does not change gets no pass.
RgbImage resize_bicubic_aa(const RgbImage& in, uint32_t out_w, uint32_t out_h);

// Normalised patches of an image already at a size the geometry allows (sides multiples of
// patch * merge).
model::ImagePatches image_patches(const RgbImage& resized, const VisionGeometry& g);

// Decode + smart resize + resize + patches. `where` names the image in errors ("images[1]").
// rgb_only: the patches' grid and the resized image (ImagePatches::rgb, for the GPU tower), no
// pixels.
model::ImagePatches preprocess_image(const ImageInput& image, const VisionGeometry& g, uint64_t max_pixels, const std::string& where,
                                     bool rgb_only = false);

}  // namespace clefrt
