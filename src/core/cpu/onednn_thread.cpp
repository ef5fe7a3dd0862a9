#include "onednn_thread.hpp"

#include <ATen/Parallel.h>

#include <thread>

// The header ships with LibTorch's x86 builds; without it there is no oneDNN error to recognise.
#if __has_include(<oneapi/dnnl/dnnl_common.hpp>)
#include <oneapi/dnnl/dnnl_common.hpp>
#define SAPIENS_SEG_HAS_DNNL 1
#endif

namespace sapiens_seg::core {
namespace {

thread_local bool onednn_failed = false;

}  // namespace

bool is_onednn_out_of_memory(const std::exception_ptr& e) noexcept {
#ifdef SAPIENS_SEG_HAS_DNNL
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const dnnl::error& err) {
    return err.status == dnnl_out_of_memory;
  } catch (...) {
  }
#else
  (void)e;
#endif
  return false;
}

bool onednn_failed_on_this_thread() noexcept {
  return onednn_failed;
}

at::Tensor run_clear_of_onednn_failures(const std::function<at::Tensor()>& work) {
  if (!onednn_failed) {
    try {
      return work();
    } catch (...) {
      if (is_onednn_out_of_memory(std::current_exception())) onednn_failed = true;
      throw;
    }
  }
  // A thread per call: a call here is a whole network forward (milliseconds to seconds), so the
  // thread's start (and its OpenMP team's) is noise, and a thread that fails in turn is not kept.
  at::Tensor out;
  std::exception_ptr failure;
  std::thread fresh([&] {
    try {
      at::init_num_threads();  // OpenMP's thread count is per thread: take LibTorch's setting
      out = work();
    } catch (...) {
      failure = std::current_exception();
    }
  });
  fresh.join();
  if (failure) std::rethrow_exception(failure);
  return out;
}

}  // namespace sapiens_seg::core
