// The per-axis tables of the resizes in resize.hpp: which source pixels feed each output pixel,
// and with which weights, computed exactly as OpenCV computes them. The host loops and the
// tensor ops both read these tables, so the two paths cannot drift apart.
#pragma once

#include <cstdint>
#include <vector>

namespace sapiens_seg::core::resize_detail {

constexpr int kCoefBits = 11;  // OpenCV's INTER_RESIZE_COEF_BITS
constexpr int kCoefScale = 1 << kCoefBits;

// ksize taps per output pixel: source indices (already clamped into the image, which is
// OpenCV's replicated border) and weights. Fixed-point weights are scaled by 2048.
struct Taps {
  int ksize = 0;
  std::vector<std::int32_t> index;  // [out * ksize]
  std::vector<std::int16_t> fixed;  // [out * ksize], fixed-point tables
  std::vector<float> real;          // [out * ksize], float tables
};

// OpenCV's scale factors: inv = out / in, scale = 1 / inv (not in / out: they can differ in the
// last bit, and the tables use this one).
double inv_scale(int in, int out);
double scale_of(int in, int out);

// INTER_LINEAR. The horizontal axis forces the weight of a sample outside the image to 0 (its
// fraction is cleared); the vertical axis keeps the weight and clamps the row instead.
Taps linear_taps(int in, int out, bool horizontal);
// INTER_AREA when an axis is enlarged: bilinear weights from the overlap of the output cell
// with the source cells (OpenCV's "area mode"), with INTER_LINEAR's border rules.
Taps area_mode_taps(int in, int out, bool horizontal);
// OpenCV's own INTER_CUBIC (Keys, A = -0.75) in 11-bit fixed point. Both axes alike: the
// fraction is never cleared, samples outside the image are clamped.
Taps cubic_taps(int in, int out);

// INTER_AREA shrinking by a non-integer factor: every (source, output) overlap with its float
// weight, in OpenCV's table order (outputs ascending, sources ascending within each).
struct AreaEntry {
  std::int32_t src, dst;
  float weight;
};
std::vector<AreaEntry> area_table(int in, int out);

// The integer factor of an exact integer shrink (OpenCV's "area fast" test), else 0.
int integer_factor(int in, int out);

}  // namespace sapiens_seg::core::resize_detail
