#include "gemm.hpp"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <vector>

#include "../settings.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core::cpu {

namespace {

// AMD's families: 0x17 Zen 1/Zen+/Zen 2, 0x19 Zen 3/Zen 4, 0x1A Zen 5.
constexpr int kAmdZen5Family = 0x1A;

const c10::OperatorHandle* onednn_op(const char* overload) {
  // One handle per overload, looked up once; null where this LibTorch has no oneDNN.
  static const std::optional<c10::OperatorHandle> plain =
      c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  static const std::optional<c10::OperatorHandle> binary =
      c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", "binary"});
  const auto& op = std::string(overload).empty() ? plain : binary;
  return op ? &*op : nullptr;
}

// oneDNN refuses some dtypes on some CPUs (bfloat16 without AVX-512, for one); the first refusal
// turns its op off for that dtype for the life of the process.
std::atomic<bool>& onednn_usable(at::ScalarType dtype) {
  static std::atomic<bool> f32{true}, other{true};
  return dtype == at::kFloat ? f32 : other;
}

bool call_onednn(const char* overload, std::vector<c10::IValue>& stack, at::ScalarType dtype) {
  const c10::OperatorHandle* op = onednn_op(overload);
  if (!op || !onednn_usable(dtype).load()) return false;
  try {
    op->callBoxed(stack);
    return true;
  } catch (const c10::Error&) {
    onednn_usable(dtype).store(false);
    return false;
  }
}

// oneDNN's linear takes a 2-D input; the networks' [B, N, K] activations are flattened and the
// result viewed back.
at::Tensor rows_of(const at::Tensor& x) {
  return x.reshape({-1, x.size(-1)});
}

at::Tensor shaped_like(const at::Tensor& y, const at::Tensor& x) {
  if (x.dim() == 2) return y;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = y.size(-1);
  return y.view(shape);
}

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                         const char* act) {
  const bool gelu = std::string(act) == "gelu";
  std::vector<c10::IValue> stack{rows_of(x),
                                 w,
                                 b.defined() ? c10::IValue(b) : c10::IValue(),
                                 std::string(act),
                                 c10::List<std::optional<at::Scalar>>(),
                                 std::string(gelu ? "none" : "")};
  if (!call_onednn("", stack, x.scalar_type())) return {};
  return shaped_like(stack[0].toTensor(), x);
}

}  // namespace

const char* to_string(GemmPolicy policy) {
  switch (policy) {
    case GemmPolicy::kMkl:
      return "mkl";
    case GemmPolicy::kOnednn:
      return "onednn";
    default:
      return "split";
  }
}

GemmChoice float32_gemm_for(const CpuFeatures& cpu) {
  if (cpu.amd && cpu.avx512_core() && cpu.family >= kAmdZen5Family) {
    return {GemmPolicy::kOnednn,
            "AMD Zen 5 or later with AVX-512: MKL runs its AVX2 code on AMD cores, oneDNN the full "
            "512-bit width (2.2x MKL's rate at 4096^3 on Zen 5)"};
  }
  if (cpu.amd && !cpu.avx512_core() && cpu.avx2_fma()) {
    return {GemmPolicy::kMkl,
            "AMD without AVX-512: MKL's GEMMs ran the networks' shapes 1.15-1.37x as fast as "
            "oneDNN's on Zen 3, more than the fused GELU and residual passes save"};
  }
  return {GemmPolicy::kSplit,
          "MKL for plain GEMMs, oneDNN where it fuses the GELU or the residual add (Zen 4 and "
          "Intel AVX-512 cores, where the two libraries' GEMMs ran alike)"};
}

GemmChoice float32_gemm() {
  if (!at::hasMKLDNN() || !onednn_op("")) {
    return {GemmPolicy::kMkl, "this LibTorch has no oneDNN"};
  }
  if (const std::string v = read_settings().cpu_gemm; !v.empty()) {
    for (const GemmPolicy p : {GemmPolicy::kMkl, GemmPolicy::kSplit, GemmPolicy::kOnednn}) {
      if (v == to_string(p)) return {p, "SAPIENS_SEG_CPU_GEMM=" + v};
    }
    if (v != "auto") {
      throw Error(
          ErrorCode::kInvalidInput,
          "SAPIENS_SEG_CPU_GEMM must be 'mkl', 'split', 'onednn' or 'auto', got '" + v + "'");
    }
  }
  return float32_gemm_for(host_cpu_features());
}

std::string float32_gemm_line() {
  const GemmChoice c = float32_gemm();
  switch (c.policy) {
    case GemmPolicy::kMkl:
      return "float32 GEMMs: MKL (" + c.reason + ")";
    case GemmPolicy::kSplit:
      return "float32 GEMMs: MKL, oneDNN with fused GELU/residual (" + c.reason + ")";
    default:
      return "float32 GEMMs: oneDNN (" + c.reason +
             "); Sapiens2's backbone keeps MKL, the authors' float32 rounding, which its bf16 "
             "RoPE needs for parity";
  }
}

GemmPolicy policy_for(at::ScalarType dtype, GemmPolicy float32_policy) {
  return dtype == at::kFloat ? float32_policy : GemmPolicy::kSplit;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                  GemmPolicy policy) {
  if (policy == GemmPolicy::kOnednn && x.device().is_cpu()) {
    if (at::Tensor y = onednn_linear(x, w, b, "none"); y.defined()) return y;
  }
  return at::linear(x, w, b);
}

at::Tensor linear_gelu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                       GemmPolicy policy) {
  if (policy != GemmPolicy::kMkl) {
    if (at::Tensor y = onednn_linear(x, w, b, "gelu"); y.defined()) return y;
  }
  at::Tensor y = at::linear(x, w, b);
  at::gelu_(y);  // exact erf, as nn.GELU()
  return y;
}

at::Tensor linear_add(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& w,
                      const at::Tensor& b, GemmPolicy policy) {
  if (policy != GemmPolicy::kMkl) {
    std::vector<c10::IValue> stack{rows_of(x), rows_of(residual), w, b, std::string("add")};
    if (call_onednn("binary", stack, x.scalar_type())) {
      return shaped_like(stack[0].toTensor(), residual);
    }
  }
  return at::linear(x, w, b).add_(residual);
}

}  // namespace sapiens_seg::core::cpu
