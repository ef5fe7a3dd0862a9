// The decoder head both Sapiens families share (the authors' VitHead layout) on the CPU:
// transposed convolutions (k4, s2, p1, no bias) that double the grid, then 1x1 convolutions, each
// followed by InstanceNorm (per image, no affine) and SiLU, then a 1x1 classifier. Sapiens v1 has
// three 768-wide deconvolutions and three 768-wide convolutions; Sapiens2 has four deconvolutions
// (512, 256, 128, 64) and two 64-wide convolutions.
//
// Activations stay channels-last as [pixels, channels] matrices, one image at a time:
//  - each transposed convolution runs as four sub-pixel GEMMs on LibTorch's BLAS (kGemm) or as
//    oneDNN's deconvolution (kOnednn), whichever the CPU runs faster (cpu_head_path), or, in
//    float32 where it pays (cpu_head_winograd), by Winograd F(2x2, 2x2) on LibTorch's BLAS
//    (winograd.hpp: 9/16 of the GEMM work);
//  - InstanceNorm + SiLU is never a pass of its own: the statistics are gathered as the producing
//    layer's output lands (tile by tile on the GEMM path), and normalise + SiLU is applied when
//    the next layer reads its input;
//  - the 1x1 convolutions are GEMMs on both paths and work pixel by pixel, so one as wide as its
//    input overwrites it tile by tile: v1's three 768-channel maps at 512x384 share one buffer.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "../cpu/cpuid.hpp"

namespace sapiens_seg::core::head {

enum class CpuHeadPath {
  kGemm,    // deconvolutions as sub-pixel GEMMs, 1x1 convolutions as GEMMs (MKL for float32)
  kOnednn,  // oneDNN's deconvolutions on channels-last maps (LibTorch's conv_transpose2d)
  kMixed,   // the sub-pixel GEMMs on deconvolutions wider than kNarrowHeadWidth both ways,
            // oneDNN's on the narrower ones (Sapiens2's last two)
};
// On every path the 1x1 convolutions are GEMMs of the library the float32 GEMM policy names
// (cpu/gemm.hpp: oneDNN's matmul under kOnednn, else LibTorch's BLAS).
const char* to_string(CpuHeadPath path);  // "gemm", "onednn", "mixed"

// The path for `dtype` on this CPU, for a head whose last maps (the classifier's input) are `width`
// channels wide: v1 768, Sapiens2 64. In float32, oneDNN on CPUs without AVX-512, where its JIT
// convolutions beat MKL's GEMMs on the heads' shapes, and for narrow heads (width <=
// kNarrowHeadWidth) on Intel's AVX-512 cores; the GEMMs elsewhere, where they were measured as
// fast or faster (benchmarks/head_bench.cpp). In bfloat16, kMixed on CPUs with AMX (oneDNN's AMX
// deconvolutions won the narrow layers, lost the wide ones), the GEMMs elsewhere.
// SAPIENS_SEG_CPU_HEAD=gemm, =onednn or =mixed forces one (A/B benchmarks, tests; another value
// is an Error(kInvalidInput)); otherwise float32 takes kOnednn wherever the float32 GEMMs go to
// oneDNN (cpu/gemm.hpp, SAPIENS_SEG_CPU_GEMM included). LibTorch without oneDNN always gets kGemm.
CpuHeadPath cpu_head_path(at::ScalarType dtype, int64_t width);
// The rule itself for a given CPU (no environment, no LibTorch check): what the tests vary.
CpuHeadPath cpu_head_path_for(const CpuFeatures& cpu, at::ScalarType dtype, int64_t width);
inline constexpr int64_t kNarrowHeadWidth = 128;

// Which transposed convolutions run by Winograd F(2x2, 2x2) (winograd.hpp) instead of the path's
// direct method: none; the float32 ones with at least kWinogradMinChannels input and output
// channels (Sapiens v1's three, Sapiens2's first three: on Sapiens2's 128 -> 64 the transforms
// cost what the GEMMs save); or every float32 one (tests, A/B benchmarks).
enum class Winograd { kOff, kWide, kAll };
const char* to_string(Winograd w);
inline constexpr int64_t kWinogradMinChannels = 128;
// For `dtype` on this CPU: SAPIENS_SEG_CPU_WINOGRAD=on (kWide on any CPU), =all (kAll), =off,
// =auto or unset (the rule, and kOff wherever the float32 GEMM policy is oneDNN's: Winograd's
// GEMMs are LibTorch's BLAS; another value is an Error(kInvalidInput)). Other dtypes than float32
// always get kOff.
Winograd cpu_head_winograd(at::ScalarType dtype);
// The rule: kWide for float32 except on AMD's AVX-512 cores, where it has not been measured
// (head_bench: Zen 3 v1's head 1.1-1.2x, Sapiens2's 1.12x as fast as with oneDNN's
// deconvolutions; AMX Xeon v1's 1.22x as fast as with the sub-pixel GEMMs).
Winograd cpu_head_winograd_for(const CpuFeatures& cpu, at::ScalarType dtype);

// The weights as the checkpoints store them (already in the network's dtype, on the CPU):
// deconv_w [in, out, 4, 4], conv_w [out, in, 1, 1] with conv_b [out], seg_w [classes, in, 1, 1]
// with seg_b [classes]. conv_b is not needed: InstanceNorm without affine follows each 1x1
// convolution and removes any per-channel constant (cpu_head.cpp).
struct HeadWeights {
  std::vector<at::Tensor> deconv_w, conv_w, conv_b;
  at::Tensor seg_w, seg_b;
};

// Immutable once built; forward may run on several threads at once.
class CpuHead {
 public:
  CpuHead() = default;
  // Picks each deconvolution's method (Winograd where `winograd` selects it, else the one `path`
  // names for it), re-lays its weight out once for that method, and transforms Winograd's filters.
  CpuHead(const HeadWeights& weights, CpuHeadPath path, Winograd winograd = Winograd::kOff);

  // feat: [B, gh * gw, C] contiguous, after the backbone's final norm. Returns the logits
  // [B, classes, gh * 2^s, gw * 2^s] for s deconvolutions, in feat's dtype.
  at::Tensor forward(const at::Tensor& feat, int64_t gh, int64_t gw) const;
  CpuHeadPath path() const { return path_; }
  // How many of the transposed convolutions run by Winograd (the first ones: the wide end), and
  // how many by oneDNN's deconvolution (the last ones: the narrow end).
  int64_t winograd_layers() const;
  int64_t onednn_layers() const;
  bool empty() const { return deconv_.empty(); }

 private:
  CpuHeadPath path_ = CpuHeadPath::kGemm;
  // How a transposed convolution runs, and its weight's layout in deconv_: sub-pixel GEMMs
  // [ky, kx, in, out] (one matrix per kernel tap), oneDNN's as stored (channels-last), Winograd's
  // transformed filters [4, 9, in, out]. conv_w_ and seg_w_ [in, out], conv_w_oi_ and seg_w_oi_
  // [out, in].
  enum class Deconv { kGemm, kOnednn, kWinograd };
  std::vector<Deconv> method_;
  std::vector<at::Tensor> deconv_, conv_w_, conv_w_oi_;
  at::Tensor seg_w_, seg_w_oi_, seg_b_;
};

}  // namespace sapiens_seg::core::head
