#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <openssl/opensslv.h>
#include <opencv2/core/version.hpp>

#include "../core/attention/cpu_attention.hpp"
#include "../core/backends/backends.hpp"
#include "../core/cpu/cpuid.hpp"
#include "../core/cpu/cpuinfo.hpp"
#include "../core/cpu/gemm.hpp"
#include "../core/resize/wheel_cubic.hpp"
#include "../io/paths.hpp"
#include "sapiens_seg/cards.hpp"
#include "sapiens_seg/version.hpp"

namespace sapiens_seg {

namespace {
SystemInfo system_info_unguarded() {
  SystemInfo s;
  s.version = SAPIENS_SEG_VERSION;
  s.torch_version = TORCH_VERSION;
  s.opencv_version = CV_VERSION;
  s.openssl_version = OPENSSL_VERSION_TEXT;
  s.threads = at::get_num_threads();
  s.cuda_available = at::hasCUDA();
  s.kernels_compiled = core::kernels_compiled();
  if (s.cuda_available) {
    s.cuda_devices = static_cast<int>(at::getNumGPUs());
  }
  const core::CpuCaps& caps = core::cpu_caps();
  std::string cpu_dtypes = "float32";
  for (const auto t : {at::kBFloat16, at::kHalf}) {
    if (core::cpu_dtype_unavailable_reason(caps, t).empty())
      cpu_dtypes += ", " + core::dtype_name(t);
  }
  s.backends.emplace_back(
      "portable: cpu (" + cpu_dtypes + ")" +
      std::string(s.cuda_available ? "; cuda (float16, bfloat16, float32)" : ""));
  s.backends.emplace_back("original: cpu (float32)" +
                          std::string(s.cuda_available ? "; cuda (float32)" : ""));
  const std::string why = core::kernels_unavailable_reason(
      s.cuda_available ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU));
  s.backends.emplace_back(why.empty() ? std::string("kernels: cuda")
                                      : "kernels: unavailable (" + why + ")");
  s.cpu_model = caps.model;
  s.cpu_flags = caps.flags();
  s.onednn_cap = caps.onednn_cap_text;
  s.cpu_dtypes = core::cpu_dtype_lines(caps);
  s.cpu_attention = core::attention::cpu_attention_lines();
  s.cpu_gemm = core::cpu::float32_gemm_line();
  const core::CpuFeatures& f = core::host_cpu_features();
  s.cpu_id = (caps.vendor.empty() ? std::string("unknown vendor") : caps.vendor) + " family " +
             std::to_string(f.family) + " model " + std::to_string(f.model) + " stepping " +
             std::to_string(f.stepping);
  s.wheel_cubic_path = core::resize_detail::to_string(core::resize_detail::wheel_ipp_path());
  s.card_dirs = io::card_dirs();
  return s;
}
}  // namespace

SystemInfo system_info() {
  // LibTorch's device queries and the CPU probes may throw their own types (a broken CUDA
  // driver, no memory for a thread pool); callers get the library's.
  try {
    return system_info_unguarded();
  } catch (...) {
    throw as_error(std::current_exception(), "system_info");
  }
}

}  // namespace sapiens_seg
