// Which library runs the portable network's float32 GEMMs on this CPU, and the linear layers
// that follow the choice.
//
// LibTorch sends a float32 linear or addmm to MKL's sgemm. MKL picks its code by CPU vendor: on
// AMD cores it runs its AVX2 code even where the core has full-width AVX-512, while oneDNN's JIT
// kernels (reached through `mkldnn::_linear_pointwise`, the op LibTorch's own compiler emits for
// CPU linears) use the whole vector width on any vendor. On an AMD Zen 5 core (2 threads) a
// 4096^3 float32 GEMM ran at 199 GFLOP/s through MKL and 435 through oneDNN; on Zen 4, whose
// AVX-512 units are 256 bits wide, and on AVX2-only cores the two were close
// (benchmarks/gemm_paths.py; its result files under benchmarks/results/ back each row of the
// table in gemm.cpp).
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

#include "../cpuid.hpp"

namespace sapiens_seg::core::cpu {

enum class GemmLibrary { kMkl, kOnednn };
const char* to_string(GemmLibrary library);  // "mkl", "onednn"

struct GemmChoice {
  GemmLibrary library = GemmLibrary::kMkl;
  std::string reason;  // why, in words, for `info`
};

// The table for a given CPU (no environment, no LibTorch check): what the tests vary.
GemmChoice float32_gemm_for(const CpuFeatures& cpu);

// This process's choice: SAPIENS_SEG_CPU_GEMM=mkl or =onednn forces one (A/B benchmarks, tests;
// another value is an Error(kInvalidInput), `auto` or unset is the table); LibTorch without
// oneDNN always gets MKL. Read from the environment on every call (a few microseconds): the
// networks ask once per forward pass.
GemmChoice float32_gemm();

// `info`'s line: "float32 GEMMs: oneDNN (why)".
std::string float32_gemm_line();

// y = x W^T + b (x [..., K], w [N, K], b [N]) through `library`. float32 on kOnednn runs oneDNN's
// linear; anything else at::linear (MKL for float32, oneDNN for bfloat16/float16). Where this
// LibTorch refuses oneDNN's op, at::linear runs and later calls skip the attempt.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                  GemmLibrary library);
// GELU(x W^T + b) with exact erf, the GELU fused into oneDNN's GEMM whenever its op runs (any
// library choice: the fusion saves a pass over the output, which outweighs the GEMMs' difference
// everywhere but on MKL's fast path, see linear_add).
at::Tensor linear_gelu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
// residual + x W^T + b, the add fused into oneDNN's GEMM where its op runs.
at::Tensor linear_add(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& w,
                      const at::Tensor& b);

}  // namespace sapiens_seg::core::cpu
