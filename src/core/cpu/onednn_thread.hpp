// oneDNN after it ran out of memory on a thread.
//
// oneDNN writes each primitive's machine code with Xbyak, which records a failed allocation of
// its code buffer in a thread-local flag that nothing in LibTorch clears. After one primitive
// could not get memory on a thread, every primitive built later on that thread fails too ("could
// not create a primitive", status out_of_memory), however much memory is free by then; primitives
// already in oneDNN's cache still run. Seen with the LibTorch this project pins
// (tests/cpp/test_onednn_thread.cpp checks it). The flag is private to LibTorch's library, so the
// library cannot reset it: it moves the work off such a thread instead.
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <functional>

namespace sapiens_seg::core {

// Whether `e` is oneDNN failing for want of memory (dnnl::error with dnnl_out_of_memory).
bool is_onednn_out_of_memory(const std::exception_ptr& e) noexcept;

// work() on the calling thread; once oneDNN has run out of memory there, on a fresh thread
// (LibTorch's thread count carried over) for every later call from this thread. The result, or
// the exception, comes back to the caller either way. For CPU work only: a fresh thread does not
// inherit the caller's CUDA stream.
at::Tensor run_clear_of_onednn_failures(const std::function<at::Tensor()>& work);

// Whether the calling thread has met oneDNN's out-of-memory failure (for the tests).
bool onednn_failed_on_this_thread() noexcept;

}  // namespace sapiens_seg::core
