#include "fork.hpp"

#include "sapiens_seg/model.hpp"

#include <pthread.h>

#include <ATen/Parallel.h>

#include <atomic>

namespace sapiens_seg::api {
namespace {

std::atomic<bool> g_pending{false};  // forked, and the thread count not yet set
std::atomic<bool> g_forked{false};

void on_fork_in_child() {
  g_pending.store(true);
  g_forked.store(true);
}

// Registered when the library is loaded, so a child forked at any time after is marked.
const bool g_registered = [] {
  return ::pthread_atfork(nullptr, nullptr, &on_fork_in_child) == 0;
}();

}  // namespace

void settle_after_fork() {
  if (g_pending.exchange(false)) at::set_num_threads(1);
}

}  // namespace sapiens_seg::api

namespace sapiens_seg {

bool forked_child() noexcept {
  (void)api::g_registered;
  return api::g_forked.load();
}

}  // namespace sapiens_seg
