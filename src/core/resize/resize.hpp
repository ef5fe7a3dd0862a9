// The authors' image resizes (cv2.resize on 8-bit images), reproduced byte for byte by the
// project's own arithmetic, on the host (threaded loops over raw pixels) and on tensors (any
// device: the device pipeline). Nothing here calls OpenCV: the bytes must not depend on the
// OpenCV the build links (Debian 12's 4.6 gives other INTER_CUBIC bytes than the opencv-python
// wheels the authors' users install).
//
// The reference is opencv-python(-headless) 5.0.0.93 on x86-64. Its arithmetic, read from the
// OpenCV 5.0.0 sources and checked against the wheel (tests/python/test_resize.py):
// - INTER_LINEAR: 11-bit fixed-point weights, an int32 horizontal pass, and a vertical pass that
//   drops 4 bits of each row term, takes the high 16 bits of its product with the weight and
//   rounds the sum by its last 2 bits. An exact 2x shrink on both axes is INTER_AREA's 2x2 mean.
// - INTER_AREA: shrinking by an integer factor on both axes averages blocks (2x2: rounded up at
//   .5; other factors: the float mean rounded to even); shrinking by other factors weights each
//   source pixel by its overlap in float32; enlarging either axis is a bilinear filter with
//   area weights in the INTER_LINEAR machinery.
// - INTER_CUBIC: the wheel runs Intel IPP's cubic (B=0, C=0.75) in float32, whose last bits
//   depend on the IPP code path the CPU selects; OpenCV's own code (what the wheel runs with
//   cv2.setUseOptimized(False), and what builds without IPP run) uses 11-bit weights, an int32
//   horizontal pass and a float32 vertical pass. Both are reproduced (CubicFlavor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <ATen/Tensor.h>

#include "cpu.hpp"

namespace sapiens_seg::core {

enum class Interp {
  kLinear,  // cv2.INTER_LINEAR (Sapiens v1's demo)
  kArea,    // cv2.INTER_AREA
  kCubic,   // cv2.INTER_CUBIC
};

// Whose INTER_CUBIC bytes to reproduce.
enum class CubicFlavor {
  kWheel,   // the x86-64 opencv-python wheel with its defaults (IPP, for this CPU's code path)
  kOpenCV,  // OpenCV's own code: cv2.setUseOptimized(False), or a build without IPP
};

// The Sapiens2 demo's choice: INTER_AREA when the width shrinks, else INTER_CUBIC (one flag for
// both axes, decided by the width alone).
inline Interp sapiens2_interp(int src_width, int dst_width) {
  return dst_width < src_width ? Interp::kArea : Interp::kCubic;
}

Interp parse_interp(const std::string& name);  // "linear", "area", "cubic"
const char* to_string(Interp interp);

// A packed 8-bit image with `channels` interleaved channels (1 to 4); rows `stride` bytes apart.
struct PixelsU8 {
  const std::uint8_t* data = nullptr;
  int height = 0, width = 0, channels = 3;
  std::size_t stride = 0;  // 0: width * channels
};
struct MutablePixelsU8 {
  std::uint8_t* data = nullptr;
  int height = 0, width = 0, channels = 3;
  std::size_t stride = 0;
};

// cv2.resize(src, (dst.width, dst.height), interpolation=interp) into dst (same channels). Rows
// are spread over LibTorch's intra-op threads. A same-size "resize" copies, as OpenCV does.
void resize_u8(const PixelsU8& src, const MutablePixelsU8& dst, Interp interp,
               CubicFlavor flavor = CubicFlavor::kWheel);

namespace resize_detail {
// resize_u8 with the host loops of `simd` (resize_u8 takes host_simd()): tests and benchmarks
// compare the portable loops with the vector ones on one machine. An instruction set the CPU
// lacks must not be asked for.
void resize_u8_simd(const PixelsU8& src, const MutablePixelsU8& dst, Interp interp,
                    CubicFlavor flavor, Simd simd);
}  // namespace resize_detail

// A small table built on the host, moved to `device`: on a GPU through pinned memory and without
// a host wait, so the stream keeps running while the next image is decoded. The CPU gets `host`.
// (Here, below tensor_ops.hpp, because the tensor resizes' tap tables need it too.)
at::Tensor to_device(const at::Tensor& host, const c10::Device& device);

// The same on a uint8 [h, w, C] tensor (any device, any strides), as tensor ops; returns a
// uint8 [H, W, C] tensor on the same device with the same bytes as resize_u8.
at::Tensor resize_tensor(const at::Tensor& img, int64_t H, int64_t W, Interp interp,
                         CubicFlavor flavor = CubicFlavor::kWheel);

}  // namespace sapiens_seg::core
