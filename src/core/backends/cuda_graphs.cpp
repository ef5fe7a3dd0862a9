// CUDA graphs for the network: the first call of each batch shape is captured and later calls
// of that shape replay it, which removes the per-kernel launch cost (a 0.3b forward pass is over
// a thousand launches; at batch 1 on a large GPU the launches, not the arithmetic, bound it).
// Compiled only into CUDA builds (SAPIENS_SEG_WITH_KERNELS); backends.cpp has the stand-in.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends.hpp"

namespace sapiens_seg::core {
namespace {

class GraphedRunner final : public Runner {
 public:
  GraphedRunner(std::unique_ptr<Runner> inner, std::size_t max_graphs)
      : inner_(std::move(inner)), max_graphs_(max_graphs) {
    // Captures run on a stream of this runner's own: a stream from LibTorch's pool could be
    // handed to another thread's call during a capture, whose work would then land in the graph.
    const c10::cuda::CUDAGuard guard(inner_->device());
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
  }
  ~GraphedRunner() override {
    entries_.clear();
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
    Entry* e = find(x);
    if (!e) e = capture(x);
    if (!e->graph) return inner_->forward_device(x);  // this shape could not be captured
    e->input.copy_(x, /*non_blocking=*/true);
    e->graph->replay();
    return e->output.clone();
  }

  c10::Device device() const override { return inner_->device(); }
  const Backend& backend() const override { return inner_->backend(); }

 private:
  struct Entry {
    std::vector<int64_t> sizes;
    at::ScalarType dtype;
    at::Tensor input, output;
    std::unique_ptr<at::cuda::CUDAGraph> graph;  // null: capture failed, run eagerly
  };

  Entry* find(const at::Tensor& x) const {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->sizes == x.sizes().vec() && it->dtype == x.scalar_type()) {
        entries_.splice(entries_.begin(), entries_, it);  // most recently used first
        return &entries_.front();
      }
    }
    return nullptr;
  }

  Entry* capture(const at::Tensor& x) const {
    if (entries_.size() >= max_graphs_) {
      // Earlier calls, on other streams, may still be reading the evicted entry's input buffer;
      // once freed, the allocator could hand it to any stream. Eviction is rare (more shapes
      // than graphs): wait for them.
      last_.synchronize();
      entries_.pop_back();  // also frees that graph's memory pool
    }
    Entry e;
    e.sizes = x.sizes().vec();
    e.dtype = x.scalar_type();
    const auto current = at::cuda::getCurrentCUDAStream();
    const at::cuda::CUDAStream side =
        at::cuda::getStreamFromExternal(capture_stream_, inner_->device().index());
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(side);
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      e.input = at::empty_like(x, x.options().device(inner_->device()));
      e.input.copy_(x);
      // Two eager calls first: lazy set-up (cuBLAS handles, cuDNN plans, allocator blocks)
      // happens outside the capture. Their errors (out of memory, a bad input) are the call's.
      inner_->forward_device(e.input);
      inner_->forward_device(e.input);
      auto graph = std::make_unique<at::cuda::CUDAGraph>();
      try {
        graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
        try {
          e.output = inner_->forward_device(e.input);
          graph->capture_end();
        } catch (...) {
          try {
            graph->capture_end();
          } catch (...) {
          }
          throw;
        }
        e.graph = std::move(graph);
      } catch (const std::exception&) {
        // A network step that cannot be captured (a host synchronisation, say) is not an
        // error: this shape runs eagerly from now on.
        e.output = at::Tensor();
        (void)cudaGetLastError();  // clear the capture's error so later launches are unaffected
      }
    }
    at::cuda::CUDAEvent done;
    done.record(side);
    done.block(current);
    entries_.push_front(std::move(e));
    return &entries_.front();
  }

  std::unique_ptr<Runner> inner_;
  std::size_t max_graphs_;
  mutable std::mutex mu_;
  mutable std::list<Entry> entries_;
  mutable at::cuda::CUDAEvent last_;  // the end of the previous call's device work
  cudaStream_t capture_stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Runner> with_cuda_graphs(std::unique_ptr<Runner> runner, std::size_t max_graphs) {
  if (!runner || runner->device().is_cpu() || max_graphs == 0) return runner;
  return std::make_unique<GraphedRunner>(std::move(runner), max_graphs);
}

}  // namespace sapiens_seg::core
