#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <openssl/opensslv.h>
#include <opencv2/core/version.hpp>

#include "../core/backends.hpp"
#include "../io/paths.hpp"
#include "sapiens_seg/cards.hpp"
#include "sapiens_seg/version.hpp"

namespace sapiens_seg {

SystemInfo system_info() {
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
  s.backends.emplace_back(
      "portable: cpu (float32, bfloat16)" +
      std::string(s.cuda_available ? "; cuda (float16, bfloat16, float32)" : ""));
  s.backends.emplace_back("original: cpu (float32)" +
                          std::string(s.cuda_available ? "; cuda (float32)" : ""));
  const std::string why = core::kernels_unavailable_reason(
      s.cuda_available ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU));
  s.backends.emplace_back(why.empty() ? std::string("kernels: cuda")
                                      : "kernels: unavailable (" + why + ")");
  s.card_dirs = io::card_dirs();
  return s;
}

}  // namespace sapiens_seg
