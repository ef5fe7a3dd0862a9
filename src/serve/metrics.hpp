// The server's Prometheus metrics (text exposition format 0.0.4): counters of requests by
// endpoint and status and of rejections by reason, histograms of queue wait, inference time and
// batch size, gauges of queue depth and requests in flight. Label values come from fixed sets
// (routes, reasons, model ids), never from a client, so the series stay bounded.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace sapiens_seg::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // `name`_bucket{le=...}, _sum and _count lines, with `labels` ("model=\"x\"") in each.
  void write(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<std::uint64_t> counts_;  // one per bound, plus +Inf
  double sum_ = 0;
  std::uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics() = default;
  // The models' series; called once, before any batch runs.
  void set_models(const std::vector<std::string>& models);

  void request(const std::string& endpoint, int status);
  void rejection(const std::string& reason);
  // One network batch of `model`: its size and how long Model::run took.
  void batch(const std::string& model, std::size_t size, double seconds);
  void queue_wait(const std::string& model, double seconds);
  std::atomic<std::int64_t>& in_flight() { return in_flight_; }
  std::atomic<std::int64_t>& connections() { return connections_; }

  // The text of /metrics; `queue_depth` reads each model's queue now.
  std::string text(const std::function<std::size_t(const std::string&)>& queue_depth) const;

 private:
  struct PerModel {
    Histogram queue_wait, inference, batch_size;
    std::atomic<std::uint64_t> batches{0}, images{0};
    PerModel();
  };
  std::vector<std::string> models_;
  std::map<std::string, std::unique_ptr<PerModel>> per_model_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, std::uint64_t> requests_;
  std::map<std::string, std::uint64_t> rejections_;
  std::atomic<std::int64_t> in_flight_{0}, connections_{0};
};

}  // namespace sapiens_seg::serve
