#include "worker.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "gpu_extras.hpp"
#include "library.hpp"
#include "machine.hpp"
#include "sapiens_seg/error.hpp"
#include "sapiens_seg/names.hpp"
#include "timing.hpp"

namespace speed_check {
using json = nlohmann::json;

std::vector<std::uint8_t> synthetic_rgb(int h, int w, int index) {
  std::vector<std::uint8_t> px(static_cast<size_t>(h) * w * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      std::uint8_t* p = px.data() + (static_cast<size_t>(y) * w + x) * 3;
      p[0] = static_cast<std::uint8_t>((static_cast<int64_t>(x) * 255) / std::max(w - 1, 1));
      p[1] = static_cast<std::uint8_t>((static_cast<int64_t>(y) * 255) / std::max(h - 1, 1));
      p[2] = static_cast<std::uint8_t>(
          ((static_cast<int64_t>(x) + y) * 7 + static_cast<int64_t>(index) * 31) % 256);
    }
  }
  return px;
}

namespace {

// The column's load options: the command line's, then its mode and dtype.
sapiens_seg::LoadOptions column_options(const Options& o) {
  sapiens_seg::LoadOptions opt = apply_load_options(o.load_options);
  if (o.worker_mode != "original-autocast") sapiens_seg::set_option(opt, "mode", o.worker_mode);
  sapiens_seg::set_option(opt, "dtype", o.worker_dtype);
  return opt;
}

std::unique_ptr<LibraryColumn> load_column(const Options& o) {
  const sapiens_seg::LoadOptions opt = column_options(o);
  // The benchmark's own column, which the library has no mode for (gpu_extras.hpp says why).
  if (o.worker_mode == "original-autocast") return gpu_extras::load_original_autocast(o.model, opt);
  return load_library_column(o.model, opt);
}

json backend_json(const sapiens_seg::Backend& b) {
  return {{"mode", b.mode}, {"device", b.device}, {"dtype", b.dtype}};
}

void write_file(const std::string& path, const void* data, std::size_t bytes) {
  std::ofstream(path, std::ios::binary)
      .write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

}  // namespace

int run_worker(const Options& o) {
  auto reply = [](const json& j) {
    std::cout << j.dump() << std::endl;  // flushed: the parent waits for the line
  };
  std::unique_ptr<LibraryColumn> column;
  std::vector<double> loads;
  const std::int64_t rss_before_load = vm_status("VmRSS");
  reset_peak_rss();
  try {
    for (int i = 0; i < std::max(1, o.load_repeats); ++i) {
      column.reset();  // the previous model goes first, as it would in a fresh process
      const auto t0 = Clock::now();
      column = load_column(o);
      loads.push_back(ms_since(t0));
    }
  } catch (const sapiens_seg::Error& e) {
    reply({{"event", "unavailable"},
           {"reason", e.what()},
           {"code", std::string(sapiens_seg::to_string(e.code()))}});
    return 0;
  } catch (const std::exception& e) {
    reply({{"event", "unavailable"}, {"reason", e.what()}});
    return 0;
  }
  const char* omp = std::getenv("OMP_NUM_THREADS");
  reply({{"event", "ready"},
         {"load_ms", loads},
         {"threads", at::get_num_threads()},
         {"omp_num_threads", omp ? json(omp) : json(nullptr)},
         {"backend", backend_json(column->backend())},
         {"pipeline", column->pipeline()},
         {"rss_before_load", rss_before_load},
         {"load_peak_rss", vm_status("VmHWM")},
         {"rss_after_load", vm_status("VmRSS")}});

  Images images;
  double cpu_ms = 0;  // CPU time of the last call, all threads
  double net_ms = 0;  // the network's share of the last call
  auto call = [&] {
    gpu_extras::sync(o.device);
    const double c0 = process_cpu_ms();
    const auto t0 = Clock::now();
    net_ms = column->segment(images);
    gpu_extras::sync(o.device);
    const double ms = ms_since(t0);
    cpu_ms = process_cpu_ms() - c0;
    return ms;
  };
  for (std::string line; std::getline(std::cin, line);) {
    if (line.empty()) continue;
    const json cmd = json::parse(line);
    const std::string kind = cmd.value("cmd", "");
    try {
      if (kind == "quit") break;
      if (kind == "prepare") {
        images.height = cmd.at("height");
        images.width = cmd.at("width");
        images.rgb.clear();
        for (int i = 0; i < cmd.at("batch").get<int>(); ++i)
          images.rgb.push_back(synthetic_rgb(images.height, images.width, i));
        const double first = call();
        std::vector<double> warm;
        for (int i = 0; i < cmd.value("warmup", 3); ++i) warm.push_back(call());
        reset_peak_rss();
        gpu_extras::reset_cuda_peaks(o.device);
        reply({{"first_ms", first}, {"warmup_ms", warm}});
      } else if (kind == "run") {
        std::vector<double> ms, cpu, net;
        for (int i = 0; i < cmd.at("calls").get<int>(); ++i) {
          ms.push_back(call());
          cpu.push_back(cpu_ms);
          net.push_back(net_ms);
        }
        reply({{"ms", ms}, {"cpu_ms", cpu}, {"net_ms", net}});
      } else if (kind == "peak") {
        json peaks = {{"peak_rss", vm_status("VmHWM")}, {"rss", vm_status("VmRSS")}};
        gpu_extras::add_cuda_peaks(o.device, peaks);
        peaks["graphs"] = gpu_extras::graph_counts(*column);
        reply(peaks);
      } else if (kind == "split") {
        reply(gpu_extras::split(o.model, o.worker_mode, column_options(o)));
      } else if (kind == "outputs") {
        // Raw float32 logits and uint8 labels into two files, for the parent to compare.
        const int oh = cmd.at("height"), ow = cmd.at("width");
        const Outputs out = column->outputs(synthetic_rgb(oh, ow, 0), oh, ow);
        const std::string prefix = cmd.at("prefix");
        write_file(prefix + ".logits", out.raw_logits.data(),
                   out.raw_logits.size() * sizeof(float));
        write_file(prefix + ".labels", out.labels.data(), out.labels.size());
        reply({{"logits", out.raw_logits.size()}, {"labels", out.labels.size()}});
      } else {
        reply({{"error", "unknown command " + kind}});
      }
    } catch (const std::exception& e) {
      reply({{"error", e.what()}});
    }
  }
  return 0;
}

}  // namespace speed_check
