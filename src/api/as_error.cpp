// sapiens_seg::as_error: every exception LibTorch, OpenCV or the standard library can throw, as
// the library's one error type. It lives in the API layer because it knows both LibTorch (core)
// and OpenCV (io).
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <new>
#include <string>
#include <system_error>

#include <opencv2/core.hpp>

// oneDNN (LibTorch's CPU convolutions, and its bf16 GEMMs) throws its own exception type, whose
// text ("could not create a primitive") does not say why; its status does. The header ships with
// LibTorch's x86 builds.
#if __has_include(<oneapi/dnnl/dnnl_common.hpp>)
#include <oneapi/dnnl/dnnl_common.hpp>
#define SAPIENS_SEG_HAS_DNNL 1
#endif

#include "sapiens_seg/error.hpp"

namespace sapiens_seg {
namespace {

// LibTorch's CPU allocator reports a failed allocation as a plain c10::Error ("DefaultCPUAllocator:
// can't allocate memory: you tried to allocate N bytes"); CUDA, cuBLAS and cuDNN as
// c10::OutOfMemoryError or in their status text.
bool says_out_of_memory(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* p : {"out of memory", "can't allocate memory", "cannot allocate memory",
                        "not enough memory", "alloc_failed", "std::bad_alloc"}) {
    if (text.find(p) != std::string::npos) return true;
  }
  return false;
}

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

std::string join(const std::string& context, const std::string& what) {
  return context.empty() ? what : context + ": " + what;
}

}  // namespace

Error as_error(const std::exception_ptr& e, const std::string& context) {
  if (!e) return Error(ErrorCode::kInternal, join(context, "no exception"));
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err;
  } catch (const c10::OutOfMemoryError& err) {
    return Error(ErrorCode::kOutOfMemory,
                 join(context, "out of memory: " + first_line(err.what_without_backtrace())));
  } catch (const c10::Error& err) {
    const std::string what = first_line(err.what_without_backtrace());
    if (says_out_of_memory(what)) {
      return Error(ErrorCode::kOutOfMemory, join(context, "out of memory: " + what));
    }
    return Error(ErrorCode::kInternal, join(context, what));
  } catch (const std::bad_alloc&) {
    return Error(ErrorCode::kOutOfMemory, join(context, "out of memory (an allocation failed)"));
#ifdef SAPIENS_SEG_HAS_DNNL
  } catch (const dnnl::error& err) {
    // Under memory pressure oneDNN fails while building a primitive (its JIT code buffer or its
    // descriptors), with dnnl_out_of_memory and the same text as any other failure.
    const std::string what = std::string("oneDNN: ") + first_line(err.what());
    if (err.status == dnnl_out_of_memory) {
      return Error(ErrorCode::kOutOfMemory, join(context, "out of memory: " + what));
    }
    return Error(ErrorCode::kInternal,
                 join(context, what + " (status " + std::to_string(err.status) + ")"));
#endif
  } catch (const cv::Exception& err) {
    if (err.code == cv::Error::StsNoMem) {
      return Error(ErrorCode::kOutOfMemory, join(context, "out of memory: " + err.msg));
    }
    return Error(ErrorCode::kInternal, join(context, first_line(err.what())));
  } catch (const std::system_error& err) {
    // std::thread reports a thread it cannot start (no memory for its stack) as EAGAIN.
    if (err.code() == std::errc::resource_unavailable_try_again ||
        err.code() == std::errc::not_enough_memory) {
      return Error(ErrorCode::kOutOfMemory,
                   join(context, std::string("out of resources: ") + err.what()));
    }
    return Error(ErrorCode::kInternal, join(context, err.what()));
  } catch (const std::exception& err) {
    const std::string what = first_line(err.what());
    return Error(says_out_of_memory(what) ? ErrorCode::kOutOfMemory : ErrorCode::kInternal,
                 join(context, what));
  } catch (...) {
    return Error(ErrorCode::kInternal, join(context, "unknown exception"));
  }
}

}  // namespace sapiens_seg
