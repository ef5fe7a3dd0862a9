// INTER_CUBIC as the x86-64 opencv-python wheel (5.0.0.93) computes it with its defaults: through
// Intel IPP's cubic resize (IPP-ICV 2026.0, B = 0, C = 0.75, replicated border), whose float32
// evaluation order depends on the IPP code path the CPU selects. wheel_cubic.cpp has the
// arithmetic of each path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <ATen/Tensor.h>

#include "cpu.hpp"

namespace sapiens_seg::core::resize_detail {

// The wheel's code paths for 8-bit, 3-channel cubic resizes. They differ in a few bytes per
// million (accumulation order and fused multiply-adds); kOwn is OpenCV's own fixed-point code,
// which the wheel runs where IPP does not (no SSE4.2/AVX2/AVX-512, or OPENCV_IPP=disabled).
enum class IppPath {
  kK0Icx,  // IPP's AVX-512 library on a CPU with AVX512_VPOPCNTDQ (Ice Lake, Zen 4 and later)
  kK0Skx,  // IPP's AVX-512 library without it (Skylake-X, Cascade Lake)
  kL9,     // IPP's AVX2 library
  kY8,     // IPP's SSE4.2 library
  kOwn,    // no IPP
};

// The path the wheel takes on this CPU, as IPP's dispatcher and OpenCV's start-up choose it,
// honouring OPENCV_IPP (disabled, sse42, avx2, avx512) as OpenCV does. Read once.
IppPath wheel_ipp_path();
const char* to_string(IppPath path);
// The same decision for given CPUID bits and OPENCV_IPP value (tests replay other CPUs).
IppPath ipp_path_for(const CpuFeatures& cpu, const std::string& opencv_ipp_env);

// resize_u8's INTER_CUBIC for the wheel on `path` (a source under 4 pixels on a side takes
// OpenCV's own code, as the wheel does when IPP refuses it), with the host loops of `simd`.
void wheel_cubic_host(const std::uint8_t* src, std::size_t sstride, int h, int w, int cn,
                      std::uint8_t* dst, std::size_t dstride, int H, int W, IppPath path,
                      Simd simd);

// The same as tensor ops (any device); fused multiply-adds are computed exactly in float64.
at::Tensor wheel_cubic_tensor(const at::Tensor& img, int64_t H, int64_t W, IppPath path);

}  // namespace sapiens_seg::core::resize_detail
