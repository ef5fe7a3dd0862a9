// Built with -ffp-contract=off (CMakeLists.txt): the float weights must round after every
// operation, as OpenCV's SSE2 baseline build computes them; a fused multiply-add would change
// their last bits and so the 11-bit weights that come out of them.
#include "taps.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace sapiens_seg::core::resize_detail {

double inv_scale(int in, int out) {
  return static_cast<double>(out) / static_cast<double>(in);
}

double scale_of(int in, int out) {
  return 1.0 / inv_scale(in, out);
}

namespace {

// OpenCV's saturate_cast<short>(float): round to nearest, ties to even, then clamp.
std::int16_t to_fixed(float v) {
  const float r = std::nearbyint(v * static_cast<float>(kCoefScale));
  return static_cast<std::int16_t>(std::clamp(r, -32768.0f, 32767.0f));
}

int floor_int(double v) {
  return static_cast<int>(std::floor(v));
}

// Keys' cubic convolution weights at fraction x, in OpenCV's float32 expression order.
void cubic_weights(float x, float* c) {
  const float A = -0.75f;
  c[0] = ((A * (x + 1) - 5 * A) * (x + 1) + 8 * A) * (x + 1) - 4 * A;
  c[1] = ((A + 2) * x - (A + 3)) * x * x + 1;
  c[2] = ((A + 2) * (1 - x) - (A + 3)) * (1 - x) * (1 - x) + 1;
  c[3] = 1.f - c[0] - c[1] - c[2];
}

Taps two_tap_table(int in, int out, bool horizontal, bool area_mode) {
  const double scale = scale_of(in, out), inv = inv_scale(in, out);
  Taps t;
  t.ksize = 2;
  t.index.resize(static_cast<std::size_t>(out) * 2);
  t.fixed.resize(static_cast<std::size_t>(out) * 2);
  for (int d = 0; d < out; ++d) {
    int s = 0;
    float f = 0;
    if (!area_mode) {
      f = static_cast<float>((d + 0.5) * scale - 0.5);
      s = static_cast<int>(std::floor(f));
      f -= static_cast<float>(s);
    } else {
      s = floor_int(d * scale);
      f = static_cast<float>((d + 1) - (s + 1) * inv);
      f = f <= 0 ? 0.f : f - std::floor(f);
    }
    if (horizontal) {
      // OpenCV clears the fraction where a tap falls outside the image (and its vector code
      // later replicates the border sample with the full weight).
      if (s < 0) f = 0, s = 0;
      if (s >= in - 1) f = 0, s = in - 1;
    }
    const std::size_t o = static_cast<std::size_t>(d) * 2;
    t.index[o] = std::clamp(s, 0, in - 1);
    t.index[o + 1] = std::clamp(s + 1, 0, in - 1);
    t.fixed[o] = to_fixed(1.f - f);
    t.fixed[o + 1] = to_fixed(f);
  }
  return t;
}

}  // namespace

Taps linear_taps(int in, int out, bool horizontal) {
  return two_tap_table(in, out, horizontal, /*area_mode=*/false);
}

Taps area_mode_taps(int in, int out, bool horizontal) {
  return two_tap_table(in, out, horizontal, /*area_mode=*/true);
}

Taps cubic_taps(int in, int out) {
  const double scale = scale_of(in, out);
  Taps t;
  t.ksize = 4;
  t.index.resize(static_cast<std::size_t>(out) * 4);
  t.fixed.resize(static_cast<std::size_t>(out) * 4);
  float c[4];
  for (int d = 0; d < out; ++d) {
    float f = static_cast<float>((d + 0.5) * scale - 0.5);
    const int s = static_cast<int>(std::floor(f));
    f -= static_cast<float>(s);
    cubic_weights(f, c);
    for (int k = 0; k < 4; ++k) {
      const std::size_t o = static_cast<std::size_t>(d) * 4 + static_cast<std::size_t>(k);
      t.index[o] = std::clamp(s - 1 + k, 0, in - 1);
      t.fixed[o] = to_fixed(c[k]);
    }
  }
  return t;
}

std::vector<AreaEntry> area_table(int in, int out) {
  const double scale = scale_of(in, out);
  std::vector<AreaEntry> tab;
  tab.reserve(static_cast<std::size_t>(in) * 2);
  for (int dx = 0; dx < out; ++dx) {
    const double fsx1 = dx * scale;
    const double fsx2 = fsx1 + scale;
    const double cell = std::min(scale, in - fsx1);
    int sx1 = static_cast<int>(std::ceil(fsx1));
    int sx2 = floor_int(fsx2);
    sx2 = std::min(sx2, in - 1);
    sx1 = std::min(sx1, sx2);
    if (sx1 - fsx1 > 1e-3) {
      tab.push_back({sx1 - 1, dx, static_cast<float>((sx1 - fsx1) / cell)});
    }
    for (int sx = sx1; sx < sx2; ++sx) tab.push_back({sx, dx, static_cast<float>(1.0 / cell)});
    if (fsx2 - sx2 > 1e-3) {
      tab.push_back({sx2, dx, static_cast<float>(std::min(std::min(fsx2 - sx2, 1.), cell) / cell)});
    }
  }
  return tab;
}

int integer_factor(int in, int out) {
  const double scale = scale_of(in, out);
  const double r = std::nearbyint(scale);  // OpenCV's saturate_cast<int>(double)
  if (r < 1 || r > 1e9) return 0;
  return std::abs(scale - r) < DBL_EPSILON ? static_cast<int>(r) : 0;
}

}  // namespace sapiens_seg::core::resize_detail
