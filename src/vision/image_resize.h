// Pillow's Image.resize(size, Resampling.BICUBIC) on 8-bit RGB, reproduced bit for bit: a separable convolution with
// Keys' cubic (a = -0.5) stretched by the scale when shrinking (support 2 x max(scale, 1) input pixels either side),
// weights normalised per output pixel and rounded to 22-bit fixed point, each pass rounded and clamped to uint8. The
// horizontal pass runs first, unless the height loses more than twice as many pixels as the width (then the
// vertical: Pillow 13's order, which changes results). A pass whose size does not change is skipped.
#pragma once

#include "vision/image.h"

namespace tern {

RgbImage image_resize_bicubic(const RgbImage& in, int out_width, int out_height);

}  // namespace tern
