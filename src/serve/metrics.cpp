#include "serve/metrics.hpp"

#include <charconv>
#include <memory>

namespace sapiens_seg::serve {

namespace {

// The shortest text that reads back as `v` ("0.0025", not "0.0025000000000000001").
std::string number(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return {buf, r.ptr};
}

// Exposition format escaping for label values (model ids may hold any file name).
std::string label_value(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

const std::vector<double> kSeconds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                      0.5,   1,      2.5,   5,    10,    30,   60};
const std::vector<double> kBatch = {1, 2, 4, 8, 16, 32, 64};

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t k = 0;
  while (k < bounds_.size() && value > bounds_[k]) ++k;
  ++counts_[k];
  sum_ += value;
  ++count_;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& labels) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string sep = labels.empty() ? "" : ",";
  std::uint64_t cumulative = 0;
  for (std::size_t k = 0; k <= bounds_.size(); ++k) {
    cumulative += counts_[k];
    out += name + "_bucket{" + labels + sep + "le=\"" +
           (k < bounds_.size() ? number(bounds_[k]) : std::string("+Inf")) + "\"} " +
           std::to_string(cumulative) + "\n";
  }
  const std::string braces = labels.empty() ? "" : "{" + labels + "}";
  out += name + "_sum" + braces + " " + number(sum_) + "\n";
  out += name + "_count" + braces + " " + std::to_string(count_) + "\n";
}

Metrics::PerModel::PerModel() : queue_wait(kSeconds), inference(kSeconds), batch_size(kBatch) {}

void Metrics::set_models(const std::vector<std::string>& models) {
  models_ = models;
  for (const auto& m : models) per_model_[m] = std::make_unique<PerModel>();
}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::rejection(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++rejections_[reason];
}

void Metrics::batch(const std::string& model, std::size_t size, double seconds) {
  const auto it = per_model_.find(model);
  if (it == per_model_.end()) return;
  it->second->batch_size.observe(static_cast<double>(size));
  it->second->inference.observe(seconds);
  ++it->second->batches;
  it->second->images += size;
}

void Metrics::queue_wait(const std::string& model, double seconds) {
  const auto it = per_model_.find(model);
  if (it != per_model_.end()) it->second->queue_wait.observe(seconds);
}

std::string Metrics::text(const std::function<std::size_t(const std::string&)>& queue_depth) const {
  std::string out;
  out +=
      "# HELP sapiens_seg_requests_total HTTP requests answered, by endpoint and status.\n"
      "# TYPE sapiens_seg_requests_total counter\n";
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, n] : requests_) {
      out += "sapiens_seg_requests_total{endpoint=\"" + label_value(key.first) + "\",status=\"" +
             std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
    }
    out +=
        "# HELP sapiens_seg_rejections_total Requests and connections refused, by reason.\n"
        "# TYPE sapiens_seg_rejections_total counter\n";
    for (const auto& [reason, n] : rejections_) {
      out += "sapiens_seg_rejections_total{reason=\"" + label_value(reason) + "\"} " +
             std::to_string(n) + "\n";
    }
  }
  const auto each_model =
      [&](const char* name, const char* help, const char* type,
          const std::function<void(const std::string&, const PerModel&, const std::string&)>&
              line) {
        out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
        for (const auto& m : models_) {
          line(name, *per_model_.at(m), "model=\"" + label_value(m) + "\"");
        }
      };
  each_model("sapiens_seg_queue_wait_seconds",
             "Time a request waited between its image being prepared and its batch starting.",
             "histogram", [&](const std::string& n, const PerModel& p, const std::string& l) {
               p.queue_wait.write(out, n, l);
             });
  each_model("sapiens_seg_inference_seconds", "Duration of one network batch (Model::run).",
             "histogram", [&](const std::string& n, const PerModel& p, const std::string& l) {
               p.inference.write(out, n, l);
             });
  each_model("sapiens_seg_batch_size", "Images per network batch.", "histogram",
             [&](const std::string& n, const PerModel& p, const std::string& l) {
               p.batch_size.write(out, n, l);
             });
  each_model("sapiens_seg_batches_total", "Network batches run.", "counter",
             [&](const std::string& n, const PerModel& p, const std::string& l) {
               out += n + "{" + l + "} " + std::to_string(p.batches.load()) + "\n";
             });
  each_model("sapiens_seg_images_total", "Images segmented.", "counter",
             [&](const std::string& n, const PerModel& p, const std::string& l) {
               out += n + "{" + l + "} " + std::to_string(p.images.load()) + "\n";
             });
  out +=
      "# HELP sapiens_seg_queue_depth Requests admitted to a model's queue and not yet in a "
      "batch (being prepared or waiting).\n# TYPE sapiens_seg_queue_depth gauge\n";
  for (const auto& m : models_) {
    out += "sapiens_seg_queue_depth{model=\"" + label_value(m) + "\"} " +
           std::to_string(queue_depth(m)) + "\n";
  }
  out +=
      "# HELP sapiens_seg_in_flight_requests Requests read and not yet answered.\n"
      "# TYPE sapiens_seg_in_flight_requests gauge\n"
      "sapiens_seg_in_flight_requests " +
      std::to_string(in_flight_.load()) +
      "\n"
      "# HELP sapiens_seg_open_connections Client connections open.\n"
      "# TYPE sapiens_seg_open_connections gauge\n"
      "sapiens_seg_open_connections " +
      std::to_string(connections_.load()) + "\n";
  return out;
}

}  // namespace sapiens_seg::serve
