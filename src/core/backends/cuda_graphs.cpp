// CUDA graphs for the network: the first call of each batch shape is captured and later calls
// of that shape replay it, which removes the per-kernel launch cost (a 0.3b forward pass is over
// a thousand launches; at batch 1 on a large GPU the launches, not the arithmetic, bound it).
// A shape whose capture fails runs eagerly from then on; the counts and reasons are kept
// (cuda_graphs.hpp) so a run can tell. Compiled only into CUDA builds (SAPIENS_SEG_WITH_KERNELS);
// backends.cpp has the stand-in.
#include "cuda_graphs.hpp"

#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../checkpoint/layout.hpp"
#include "backends.hpp"

namespace sapiens_seg::core {
namespace {

// at::cuda::CUDAGraph plus the clean-up of a capture that failed part way. The LibTorch of the
// GPU machine (2.11) releases a graph's private memory pool in reset() only after a successful
// capture_end(): a failed capture kept its pool for the life of the process, and when
// cudaStreamEndCapture itself failed, the allocator went on believing a capture was under way
// (its next emptyCache asserts). Later LibTorch versions track both themselves (the protected
// member allocated_pool_) and undo them in reset(); there this class does nothing extra, since
// releasing twice would break the allocator's counts.
class PoolSafeGraph final : public at::cuda::CUDAGraph {
 public:
  PoolSafeGraph() = default;
  ~PoolSafeGraph() { release_failed_capture(); }
  PoolSafeGraph(const PoolSafeGraph&) = delete;
  PoolSafeGraph& operator=(const PoolSafeGraph&) = delete;

  template <typename G = PoolSafeGraph>
  static constexpr bool torch_releases_failed_captures() {
    return requires(G & g) {
      g.allocated_pool_;
    };
  }

  // After a capture that did not end successfully: stop routing allocations to its pool and give
  // the pool back (its blocks return to the device on the allocator's next emptyCache). Each
  // call is allowed to fail: which of them LibTorch already made depends on where the capture
  // failed and on the version.
  void release_failed_capture() noexcept {
    if constexpr (!torch_releases_failed_captures()) {
      if (released_ || capture_ended_ || (mempool_id_.first == 0 && mempool_id_.second == 0)) {
        return;
      }
      released_ = true;
      auto attempt = [](auto&& f) {
        try {
          f();
        } catch (...) {  // that step was already undone (or never made) by LibTorch
        }
      };
      attempt(
          [&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(capture_dev_, mempool_id_); });
      attempt([&] { at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(mempool_id_); });
      attempt([&] { c10::cuda::CUDACachingAllocator::releasePool(capture_dev_, mempool_id_); });
      attempt([&] { at::getHostAllocator(at::kCUDA)->release_pool(mempool_id_); });
    }
  }

 private:
  bool released_ = false;
};

std::string first_line(const std::exception& e) {
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  std::string s = c ? c->what_without_backtrace() : e.what();
  return s.substr(0, s.find('\n'));
}

class GraphedRunner final : public Runner, public GraphCounting {
 public:
  GraphedRunner(std::unique_ptr<Runner> inner, std::size_t max_graphs)
      : inner_(std::move(inner)), cache_(max_graphs) {
    // Captures run on a stream of this runner's own: a stream from LibTorch's pool could be
    // handed to another thread's call during a capture, whose work would then land in the graph.
    const c10::cuda::CUDAGuard guard(inner_->device());
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
  }
  ~GraphedRunner() override {
    cache_.clear();
    if (capture_stream_) (void)cudaStreamDestroy(capture_stream_);
  }
  GraphedRunner(const GraphedRunner&) = delete;
  GraphedRunner& operator=(const GraphedRunner&) = delete;

  at::Tensor forward(const at::Tensor& x) const override {
    return forward_device(x).to(at::kCPU, at::kFloat).contiguous();
  }

  at::Tensor forward_device(const at::Tensor& x) const override {
    const c10::Device dev = inner_->device();
    const c10::cuda::CUDAGuard guard(dev);
    c10::InferenceMode inference;
    // Replays share the graph's static input and output, so one call per model at a time; the
    // upload, resize and upsample of other calls still overlap on their own streams.
    std::lock_guard<std::mutex> lock(mu_);
    // Calls come on different streams, and every graph of this model reuses the same static
    // buffers and the inner runner's workspaces: each call's device work starts after the
    // previous call's has finished.
    const auto current = at::cuda::getCurrentCUDAStream();
    last_.block(current);
    struct Release {
      at::cuda::CUDAEvent& e;
      at::cuda::CUDAStream s;
      ~Release() {
        try {
          e.record(s);
        } catch (...) {  // a failing device reports itself on the next call
        }
      }
    } release{last_, current};
    Cache::Entry* e = cache_.find(x.sizes().vec(), static_cast<int>(x.scalar_type()));
    if (!e) e = &capture(x);
    cache_.count_call(*e);
    if (!e->payload) return inner_->forward_device(x);  // this shape could not be captured
    e->payload->input.copy_(x, /*non_blocking=*/true);
    e->payload->graph->replay();
    return e->payload->output.clone();
  }

  c10::Device device() const override { return inner_->device(); }
  const Backend& backend() const override { return inner_->backend(); }

  GraphStats graph_stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return cache_.stats();
  }

 private:
  struct Captured {
    std::unique_ptr<PoolSafeGraph> graph;  // declared first: destroyed after the tensors
    at::Tensor input, output;
  };
  using Cache = GraphCache<Captured>;

  Cache::Entry& capture(const at::Tensor& x) const {
    // Earlier calls, on other streams, may still be reading the evicted entry's input buffer;
    // once freed, the allocator could hand it to any stream. Eviction is rare (more shapes than
    // graphs): wait for them.
    const auto before_evict = [this] { last_.synchronize(); };
    cache_.make_room(before_evict);  // before the warm-up calls, which need memory of their own
    const auto current = at::cuda::getCurrentCUDAStream();
    const at::cuda::CUDAStream side =
        at::cuda::getStreamFromExternal(capture_stream_, inner_->device().index());
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(side);
    Cache::Entry* added = nullptr;
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      at::Tensor input = at::empty_like(x, x.options().device(inner_->device()));
      input.copy_(x);
      // Two eager calls first: lazy set-up (cuBLAS handles, cuDNN plans, allocator blocks)
      // happens outside the capture. Their errors (out of memory, a bad input) are the call's.
      inner_->forward_device(input);
      inner_->forward_device(input);
      const std::string shape =
          shape_str(x.sizes()) + " " + std::string(c10::toString(x.scalar_type()));
      added = &cache_.add(
          x.sizes().vec(), static_cast<int>(x.scalar_type()), shape,
          [&](Captured& c) {
            c.input = input;
            c.graph = std::make_unique<PoolSafeGraph>();
            try {
              c.graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
              try {
                c.output = inner_->forward_device(c.input);
              } catch (...) {
                try {
                  c.graph->capture_end();
                } catch (...) {  // the capture is invalid: the forward pass's error says why
                }
                throw;
              }
              c.graph->capture_end();
            } catch (const std::exception& ex) {
              // A network step that cannot be captured (a host synchronisation, say) is not an
              // error: this shape runs eagerly from now on, and its pool is given back.
              c.output = at::Tensor();
              c.graph->release_failed_capture();
              (void)cudaGetLastError();  // clear the capture's error so later launches run
              throw CaptureFailed(first_line(ex));
            }
          },
          before_evict);
    }
    at::cuda::CUDAEvent done;
    done.record(side);
    done.block(current);
    return *added;
  }

  std::unique_ptr<Runner> inner_;
  mutable std::mutex mu_;
  mutable Cache cache_;
  mutable at::cuda::CUDAEvent last_;  // the end of the previous call's device work
  cudaStream_t capture_stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Runner> with_cuda_graphs(std::unique_ptr<Runner> runner, std::size_t max_graphs) {
  if (!runner || runner->device().is_cpu() || max_graphs == 0) return runner;
  return std::make_unique<GraphedRunner>(std::move(runner), max_graphs);
}

bool cuda_graphs_release_failed_captures_here() {
  return !PoolSafeGraph::torch_releases_failed_captures();
}

}  // namespace sapiens_seg::core
