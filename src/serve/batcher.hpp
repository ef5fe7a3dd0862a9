// Dynamic batching for one model: requests are prepared (decoded, resized) on the request
// threads and handed here; one worker thread takes up to max_batch of them that arrived within
// max_delay of the oldest and runs them as one Model::run call. The queue is bounded: a request
// takes a slot when it is admitted (before its image is even decoded), so what the server holds
// in decoded images is bounded too, and a full queue is refused at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "sapiens_seg/error.hpp"
#include "sapiens_seg/model.hpp"
#include "serve/metrics.hpp"

namespace sapiens_seg::serve {

using Clock = std::chrono::steady_clock;

struct BatchSettings {
  int max_batch = RunOptions{}.batch_size;
  std::chrono::microseconds max_delay{std::chrono::milliseconds(5)};
  std::size_t max_queue = 32;
};

// One request's passage through the queue. The request side fills `prepared` and `done`; the
// worker fills the outcome, then calls `done` exactly once, from its thread.
struct Job {
  Prepared prepared;
  Clock::time_point queued_at;
  // Set by the request side when its client has gone: the worker drops the job unrun.
  std::atomic<bool> abandoned{false};
  std::function<void()> done;

  std::optional<Result> result;
  std::optional<Error> error;
  bool dropped = false;  // abandoned, not run
  double queue_ms = 0;   // between queued_at and the start of its batch
};

class Batcher {
 public:
  Batcher(Model model, std::string id, BatchSettings settings, Metrics& metrics);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Takes a queue slot; false when all are taken (the caller answers 503).
  bool reserve();
  // Gives back a slot taken by reserve() for a request that ended before submit() (a bad
  // image).
  void release();
  // Queues a prepared job into the slot reserve() took.
  void submit(std::shared_ptr<Job> job);

  // Slots taken: being prepared or waiting for a batch.
  std::size_t depth() const { return taken_.load(); }
  const Model& model() const { return model_; }
  const BatchSettings& settings() const { return settings_; }

  // Lets the worker finish what is queued, then stop; joins it.
  void stop();

 private:
  void loop();
  void run_batch(std::vector<std::shared_ptr<Job>>& batch);

  Model model_;
  std::string id_;
  BatchSettings settings_;
  Metrics& metrics_;
  std::atomic<std::size_t> taken_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace sapiens_seg::serve
