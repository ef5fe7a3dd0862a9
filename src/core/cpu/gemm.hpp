// Which library runs the portable network's float32 GEMMs on this CPU, and the linear layers
// that follow the choice.
//
// LibTorch sends a float32 linear or addmm to MKL's sgemm. MKL picks its code by CPU vendor: on
// AMD cores it runs its AVX2 code even where the core has full-width AVX-512, while oneDNN's JIT
// kernels (reached through `mkldnn::_linear_pointwise`, the op LibTorch's own compiler emits for
// CPU linears) use the whole vector width on any vendor. On an AMD Zen 5 core (2 threads) a
// 4096^3 float32 GEMM ran at 199 GFLOP/s through MKL and 435 through oneDNN (measured by the
// project on a 2-core Zen 5 VM, 2026-12, before the result files kept it); on Zen 4, whose
// AVX-512 units are 256 bits wide, the two were close; on Zen 3 (AVX2) MKL ran the networks'
// shapes 1.15-1.37x as fast as oneDNN (benchmarks/gemm_paths.py, whose result files under
// benchmarks/results/<machine>/ back the table in gemm.cpp).
//
// The choice is a table of CPUs, not a timing probe at load: the same answer on every load of a
// machine, no cost in the time to the first labels, no noise from whatever else the machine is
// running. bfloat16 and float16 GEMMs are not concerned: LibTorch already runs them on oneDNN.
//
// The choice moves Sapiens v1's backbone GEMMs and both families' decoder heads. Sapiens2's
// backbone keeps MKL in float32 on every CPU (v2/sapiens2.cpp says why: its bf16 RoPE).
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "cpuid.hpp"

namespace sapiens_seg::core::cpu {

// Where the float32 GEMMs run.
enum class GemmPolicy {
  kMkl,     // every GEMM on MKL, GELU and residual adds as passes of their own
  kSplit,   // MKL for plain GEMMs, oneDNN where it fuses the GELU or the residual add
  kOnednn,  // every GEMM on oneDNN, epilogues fused
};
const char* to_string(GemmPolicy policy);  // "mkl", "split", "onednn"

struct GemmChoice {
  GemmPolicy policy = GemmPolicy::kSplit;
  std::string reason;  // why, in words, for `info`
};

// The table for a given CPU (no environment, no LibTorch check): what the tests vary.
GemmChoice float32_gemm_for(const CpuFeatures& cpu);

// This process's choice: SAPIENS_SEG_CPU_GEMM=mkl, =split or =onednn forces one (A/B benchmarks,
// tests; another value is an Error(kInvalidInput), `auto` or unset is the table); LibTorch without
// oneDNN always gets kMkl. Read from the environment on every call (a few microseconds): the
// networks ask once per forward pass.
GemmChoice float32_gemm();

// `info`'s line: "float32 GEMMs: oneDNN (why)".
std::string float32_gemm_line();

// What runs a layer of `dtype` under `policy`: float32 follows the policy; other dtypes take
// kSplit (LibTorch runs their plain GEMMs on oneDNN anyway, and the fused ones save a pass).
GemmPolicy policy_for(at::ScalarType dtype, GemmPolicy float32_policy);

// y = x W^T + b (x [..., K], w [N, K], b [N] or undefined for none): oneDNN's linear under
// kOnednn, else at::linear (MKL in float32). Where this LibTorch refuses oneDNN's op for a dtype,
// at::linear runs and later calls skip the attempt.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, GemmPolicy policy);
// GELU(x W^T + b) with exact erf: fused into oneDNN's GEMM under kSplit and kOnednn.
at::Tensor linear_gelu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                       GemmPolicy policy);
// residual + x W^T + b: the add fused into oneDNN's GEMM under kSplit and kOnednn.
at::Tensor linear_add(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& w,
                      const at::Tensor& b, GemmPolicy policy);

}  // namespace sapiens_seg::core::cpu
