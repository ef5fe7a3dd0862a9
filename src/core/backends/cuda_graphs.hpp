// What the CUDA-graph runner (cuda_graphs.cpp, with_cuda_graphs in backends.hpp) did: how many
// input shapes it captured, how many it runs eagerly because their capture failed, and why. A
// capture failure is not an error for the caller (that shape simply runs without a graph), so
// without these counts a run could never be told apart from one that replays graphs.
//
// The bookkeeping is a template over what a captured shape holds, free of CUDA, so a CPU test can
// drive it with a capture that fails on purpose.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backends.hpp"

namespace sapiens_seg::core {

struct GraphStats {
  std::size_t captured = 0;           // shapes whose capture succeeded (evicted ones included)
  std::size_t eager = 0;              // shapes whose capture failed: they run eagerly from then on
  std::size_t evicted = 0;            // entries dropped to stay within max_graphs
  std::size_t replays = 0;            // calls served by a graph (the capturing call included)
  std::size_t eager_calls = 0;        // calls of an eager shape (its first call included)
  std::vector<std::string> failures;  // "<shape>: <why>", one per eager shape

  // One line: "captured 2, eager 1 ([1,3,64,48] Half: why), evicted 0, 5 replays, 1 eager calls".
  std::string summary() const {
    std::string s = "captured " + std::to_string(captured) + ", eager " + std::to_string(eager);
    if (!failures.empty()) {
      s += " (";
      for (std::size_t i = 0; i < failures.size(); ++i) s += (i ? "; " : "") + failures[i];
      s += ")";
    }
    return s + ", evicted " + std::to_string(evicted) + ", " + std::to_string(replays) +
           " replays, " + std::to_string(eager_calls) + " eager calls";
  }
};

// Implemented by the CUDA-graph runner.
class GraphCounting {
 public:
  virtual ~GraphCounting() = default;
  virtual GraphStats graph_stats() const = 0;
};

// `runner`'s capture counts when it is a CUDA-graph runner, else nullopt (the CPU, builds
// without the kernels, max_graphs == 0).
inline std::optional<GraphStats> cuda_graph_stats(const Runner& runner) {
  if (const auto* g = dynamic_cast<const GraphCounting*>(&runner)) return g->graph_stats();
  return std::nullopt;
}

// Whether this build gives a failed capture's memory pool back itself, because the LibTorch it
// was built against does not (kernels builds only: defined in cuda_graphs.cpp).
bool cuda_graphs_release_failed_captures_here();

// Thrown by a capture function to say this shape cannot be captured (it then runs eagerly);
// any other exception is the call's own error and leaves no entry behind.
struct CaptureFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The shapes seen, most recently used first, each with its captured Payload (the graph, its
// static input and output) or none when its capture failed.
template <typename Payload>
class GraphCache {
 public:
  struct Entry {
    std::vector<std::int64_t> sizes;
    int dtype = 0;
    std::optional<Payload> payload;  // empty: the capture failed, this shape runs eagerly
  };

  explicit GraphCache(std::size_t max_entries) : max_(max_entries > 0 ? max_entries : 1) {}

  Entry* find(const std::vector<std::int64_t>& sizes, int dtype) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->sizes == sizes && it->dtype == dtype) {
        entries_.splice(entries_.begin(), entries_, it);
        return &entries_.front();
      }
    }
    return nullptr;
  }

  // Drops least recently used entries until a new one fits; before_evict() runs first.
  template <typename BeforeEvict>
  void make_room(BeforeEvict&& before_evict) {
    if (entries_.size() < max_) return;
    before_evict();
    while (entries_.size() >= max_) {
      entries_.pop_back();
      ++stats_.evicted;
    }
  }

  // A new shape: makes room (before_evict() runs before the least recently used entry goes,
  // with it its payload), then capture(Payload&). When that throws CaptureFailed, the attempt's
  // payload is destroyed at once (a half-made graph must not keep its memory) and the shape is
  // recorded as eager with the reason; other exceptions propagate and record nothing.
  template <typename Capture, typename BeforeEvict>
  Entry& add(const std::vector<std::int64_t>& sizes, int dtype, const std::string& shape,
             Capture&& capture, BeforeEvict&& before_evict) {
    make_room(before_evict);
    Entry e;
    e.sizes = sizes;
    e.dtype = dtype;
    std::optional<Payload> p(std::in_place);
    try {
      capture(*p);
      e.payload = std::move(p);
      ++stats_.captured;
    } catch (const CaptureFailed& f) {
      p.reset();
      ++stats_.eager;
      std::string why = f.what();
      why = why.substr(0, why.find('\n'));
      if (why.size() > 240) why = why.substr(0, 240) + "...";
      stats_.failures.push_back(shape + ": " + why);
    }
    entries_.push_front(std::move(e));
    return entries_.front();
  }

  void count_call(const Entry& e) { ++(e.payload ? stats_.replays : stats_.eager_calls); }
  const GraphStats& stats() const { return stats_; }
  std::size_t size() const { return entries_.size(); }
  void clear() { entries_.clear(); }

 private:
  std::size_t max_;
  std::list<Entry> entries_;
  GraphStats stats_;
};

}  // namespace sapiens_seg::core
