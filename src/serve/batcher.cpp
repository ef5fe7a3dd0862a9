#include "serve/batcher.hpp"

#include <cstdio>
#include <utility>

namespace sapiens_seg::serve {

Batcher::Batcher(Model model, std::string id, BatchSettings settings, Metrics& metrics)
    : model_(std::move(model)),
      id_(std::move(id)),
      settings_(settings),
      metrics_(metrics),
      worker_([this] { loop(); }) {}

Batcher::~Batcher() {
  stop();
}

bool Batcher::reserve() {
  std::size_t now = taken_.load();
  do {
    if (now >= settings_.max_queue) return false;
  } while (!taken_.compare_exchange_weak(now, now + 1));
  return true;
}

void Batcher::release() {
  --taken_;
}

void Batcher::submit(std::shared_ptr<Job> job) {
  job->queued_at = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void Batcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (worker_.joinable()) worker_.join();
}

void Batcher::loop() {
  const auto max_batch = static_cast<std::size_t>(std::max(1, settings_.max_batch));
  for (;;) {
    std::vector<std::shared_ptr<Job>> batch, dropped;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;  // stopping, and nothing left
      // Wait for company up to max_delay after the oldest arrived; a stop runs what is there.
      const Clock::time_point deadline = queue_.front()->queued_at + settings_.max_delay;
      cv_.wait_until(lock, deadline, [&] { return queue_.size() >= max_batch || stopping_; });
      while (!queue_.empty() && batch.size() < max_batch) {
        std::shared_ptr<Job> job = std::move(queue_.front());
        queue_.pop_front();
        --taken_;
        (job->abandoned.load() ? dropped : batch).push_back(std::move(job));
      }
    }
    for (auto& job : dropped) {
      job->dropped = true;
      job->done();
    }
    if (!batch.empty()) run_batch(batch);
  }
}

void Batcher::run_batch(std::vector<std::shared_ptr<Job>>& batch) {
  const Clock::time_point start = Clock::now();
  std::vector<Prepared> prepared;
  prepared.reserve(batch.size());
  for (const auto& job : batch) {
    job->queue_ms = std::chrono::duration<double, std::milli>(start - job->queued_at).count();
    metrics_.queue_wait(id_, job->queue_ms / 1000.0);
    prepared.push_back(job->prepared);
  }
  std::vector<Result> results;
  std::optional<Error> error;
  try {
    results = model_.run(prepared);
    if (results.size() != batch.size()) {
      throw Error(ErrorCode::kInternal, "Model::run returned " + std::to_string(results.size()) +
                                            " results for " + std::to_string(batch.size()) +
                                            " images");
    }
  } catch (...) {
    error = as_error(std::current_exception(),
                     "segmenting a batch of " + std::to_string(batch.size()) + " images");
  }
  metrics_.batch(id_, batch.size(), std::chrono::duration<double>(Clock::now() - start).count());
  for (std::size_t k = 0; k < batch.size(); ++k) {
    Job& job = *batch[k];
    if (error) {
      job.error = *error;
    } else {
      job.result = std::move(results[k]);
    }
    job.done();
  }
}

}  // namespace sapiens_seg::serve
