// Which LibTorch operators a piece of code dispatched, counted by name through LibTorch's
// RecordFunction hooks: lets a test check which library a layer ran on (oneDNN's
// `mkldnn::_linear_pointwise` against MKL's `aten::addmm`), not only that its numbers are close,
// since two GEMM libraries give results within any sensible tolerance of each other.
#pragma once

#include <ATen/record_function.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace sapiens_seg::test {

using OpCounts = std::map<std::string, int>;

// fn() with every dispatched operator counted (any thread; one counting at a time).
template <typename Fn>
OpCounts count_ops(Fn fn) {
  struct State {
    std::mutex mutex;
    OpCounts* counts = nullptr;
  };
  static State state;
  OpCounts counts;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.counts = &counts;
  }
  const at::CallbackHandle handle =
      at::addGlobalCallback(at::RecordFunctionCallback([](const at::RecordFunction& f)
                                                           -> std::unique_ptr<at::ObserverContext> {
                              std::lock_guard<std::mutex> lock(state.mutex);
                              if (state.counts) ++(*state.counts)[std::string(f.name())];
                              return nullptr;
                            }).scopes({at::RecordScope::FUNCTION}));
  struct Remove {
    at::CallbackHandle handle;
    ~Remove() {
      at::removeCallback(handle);
      std::lock_guard<std::mutex> lock(state.mutex);
      state.counts = nullptr;
    }
  } remove{handle};
  fn();
  return counts;
}

inline int count_of(const OpCounts& counts, const std::string& name) {
  const auto it = counts.find(name);
  return it == counts.end() ? 0 : it->second;
}

}  // namespace sapiens_seg::test
