// Scaled dot-product attention on the CPU for the portable network (no mask, scale 1/sqrt(hd)).
//
// LibTorch's CPU kernel (at::scaled_dot_product_attention) runs its blocks through generic GEMM
// calls and, without AMX, gets no faster in bfloat16 than in float32 (benchmarks/
// cpu_dtype_probe.py; with AMX-BF16 its blocks run on the tiles, see below). This one is written
// for the networks' shapes (thousands of tokens, head dims up to 128; the models use 60 to 80):
// packed K and V per head, register-tiled AVX-512 dot products (VDPBF16PS for bfloat16: bf16
// products summed in float32; an AVX2 + FMA twin for float32 on CPUs without AVX-512; the AMX
// tiles' TDPBF16PS for bfloat16 where the CPU has them), and an exact softmax over each query
// row's scores, which stay in float32.
//
// Arithmetic, as LibTorch's kernel does it in each dtype: scores and their softmax in float32;
// in bfloat16 the probabilities are rounded to bfloat16 before they weight V, and the float32 sum
// of the weighted V rows is divided by the float32 sum of the probabilities and rounded once.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace sapiens_seg::core {
struct CpuCaps;
}

namespace sapiens_seg::core::attention {

enum class CpuAttentionPath {
  kLibTorch,    // at::scaled_dot_product_attention
  kAvx512,      // float32 inputs, AVX-512 F/BW/DQ/VL + FMA
  kAvx512Bf16,  // bfloat16 inputs, + AVX512-BF16
  kAvx2,        // float32 inputs, AVX2 + FMA (the CPUs without AVX-512)
  kAmxBf16,     // bfloat16 inputs, head dims a multiple of 32, + AMX-BF16 tiles (the OS's too)
};
const char* to_string(CpuAttentionPath path);

// The path for `dtype` and head dim `hd` on this CPU: kLibTorch where the CPU lacks the
// instructions, for shapes the kernel does not cover, and for float32 on CPUs other than AMD's
// (on an Intel Xeon with two FMA ports LibTorch's float32 attention, on MKL's GEMMs, ran
// 1.06-1.75x faster than the kernel at hd 64 and 80; benchmarks/results/cpu-attention-xeon.json).
// bfloat16 likewise keeps LibTorch's attention on CPUs with AMX-BF16 (bfloat16_kernel_beats_
// libtorch), except where the kernel's AMX path (kAmxBf16) takes the head dim: it ran whole
// bfloat16 calls a little faster than LibTorch's own AMX attention. SAPIENS_SEG_CPU_ATTENTION=
// libtorch forces kLibTorch, =kernel the widest kernel the CPU runs (A/B benchmarks, tests).
CpuAttentionPath cpu_attention_path(at::ScalarType dtype, int64_t hd);

// The bfloat16 half of that rule for the AVX512-BF16 path, for the CPU `caps` describes: false
// with AMX-BF16, whose tiles LibTorch's own attention uses (about 3x that path's speed on a
// Sapphire Rapids-class Xeon; the kAmxBf16 path is the faster there where it runs).
bool bfloat16_kernel_beats_libtorch(const CpuCaps& caps);

// Whether `path` can run `dtype` with head dim `hd` on this CPU (kLibTorch always can). A CPU
// may run several paths (an AVX-512 CPU runs the AVX2 one too): the tests hold each to the exact
// result; cpu_attention_path picks the widest.
bool cpu_attention_runs(CpuAttentionPath path, at::ScalarType dtype, int64_t hd);

// One line per dtype for `info`: which attention the portable network runs on this CPU, and why.
std::vector<std::string> cpu_attention_lines();

// q [B, Hq, N, hd], k and v [B, Hk, N, hd] with Hk dividing Hq (kv head j serves query heads
// j*Hq/Hk .. (j+1)*Hq/Hk - 1, as repeat_interleave expands them), any strides with a contiguous
// last dim. Returns [B, N, Hq * hd] with the heads merged (the layout the output projection
// reads), in q's dtype. `path` kLibTorch is the reference; the other paths need what
// cpu_attention_runs checks and throw Error(kInvalidInput) otherwise.
at::Tensor cpu_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         CpuAttentionPath path);

}  // namespace sapiens_seg::core::attention
