// The parent: plans the columns, starts one worker process per column, drives them in lock step
// and writes the result. For each image size and batch, every worker makes its first call and
// its warm-up calls and resets its peak counters; then the timed rounds alternate between the
// workers, so that a machine shared with other jobs slows all modes alike and the ratios stay
// meaningful.
#include "parent.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <thread>

#include <torch/version.h>
#include <nlohmann/json.hpp>

#include "child.hpp"
#include "library.hpp"
#include "machine.hpp"
#include "sapiens_seg/version.hpp"
#include "timing.hpp"

namespace speed_check {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Column {
  Column(std::string id_, std::string title_, std::string mode_, std::string dtype_, bool python_,
         std::string runtime_ = "")
      : id(std::move(id_)),
        title(std::move(title_)),
        mode(std::move(mode_)),
        dtype(std::move(dtype_)),
        python(python_),
        runtime(std::move(runtime_)) {}
  std::string id, title, mode, dtype;
  bool python = false;  // original_python.py, or peers_python.py when runtime is set
  std::string runtime;  // peers_python.py --runtime (onnxruntime, openvino, ...)
  std::unique_ptr<Child> child;
  json ready;
  std::string unavailable;  // reason, when it cannot run here (or failed)
};

std::string find_quick_model(const char* argv0) {
  std::vector<fs::path> dirs;
  if (const char* f = std::getenv("SAPIENS_SEG_FIXTURES")) dirs.emplace_back(f);
  std::error_code ec;
  const fs::path exe = fs::canonical(fs::path("/proc/self/exe"), ec);
  if (!ec) dirs.push_back(exe.parent_path().parent_path() / "fixtures");
  dirs.push_back(fs::path(argv0).parent_path().parent_path() / "fixtures");
  for (const auto& d : dirs) {
    if (fs::exists(d / "tiny_b_torchscript.pt2")) return (d / "tiny_b_torchscript.pt2").string();
  }
  throw std::runtime_error(
      "--quick needs the tiny_b fixture: build it with `python tests/fixtures/make_fixtures.py "
      "--out BUILD/fixtures --only tiny_b` (or run the tests once), or pass --model");
}

std::string fmt(double v, int digits = 0) {
  if (std::isnan(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string gib(double bytes) {
  return fmt(bytes / (1024.0 * 1024.0 * 1024.0), 2);
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::localtime(&t));
  return buf;
}

// The columns --modes and --dtype ask for, in their order.
std::vector<Column> plan_columns(const Options& o, bool sapiens2) {
  const bool cpu = !is_cuda(o.device);
  std::vector<Column> cols;
  for (const auto& m : o.modes) {
    if (m == "original-python") {
      cols.emplace_back("original-python",
                        sapiens2 ? "original (Python, authors' module)" : "original (Python)",
                        "original", "float32", true);
    } else if (m == "original") {
      // Sapiens2 has no original graph; by default its column is the authors' module above.
      if (sapiens2 && !o.modes_given) continue;
      cols.emplace_back("original", "original", "original", "float32", false);
    } else if (m == "original-autocast") {
      if (cpu) continue;  // a GPU column
      const std::string d = o.dtypes.front() == "float32" ? "float16" : o.dtypes.front();
      cols.emplace_back("original autocast " + d, "original (autocast " + d + ")",
                        "original-autocast", d, false);
    } else if (m == "portable" || m == "kernels") {
      for (const auto& d : o.dtypes) cols.emplace_back(m + " " + d, m + " " + d, m, d, false);
    } else if (m == "onnxruntime" || m == "openvino" || m == "openvino-f32" ||
               m == "openvino-default" || m == "transformers") {
      if (!cpu && !o.modes_given) continue;                              // CPU peers
      if (m == "transformers" && !sapiens2 && !o.modes_given) continue;  // no v1 model there
      if (m == "onnxruntime") {
        cols.emplace_back("onnxruntime", "ONNX Runtime", m, "float32", true, "onnxruntime");
      } else if (m != "transformers") {
        // openvino-f32 alone where OpenVINO's default precision is f32 anyway (CPUs without
        // bf16 or f16 dot products): the default column would time the same graph twice.
        if (m != "openvino-default") {
          cols.emplace_back("openvino f32", "OpenVINO f32", "openvino", "float32", true,
                            "openvino");
        }
        if (m != "openvino-f32") {
          cols.emplace_back("openvino default", "OpenVINO default", "openvino", "default", true,
                            "openvino-default");
        }
      } else {
        cols.emplace_back("transformers", "transformers", m, "float32", true, "transformers");
      }
    } else {
      throw std::invalid_argument("unknown mode '" + m +
                                  "' (original-python, original, original-autocast, portable, "
                                  "kernels, onnxruntime, openvino, openvino-f32, "
                                  "openvino-default, transformers)");
    }
  }
  return cols;
}

// The ONNX peers run the project's export of the same file, checked against the original by the
// exporter before anything is timed (and by compare_outputs below, like every column).
struct OnnxExport {
  std::string path, reason;  // the file, or why there is none
  std::string dir;           // a temporary folder to remove at the end
};

OnnxExport export_onnx(const Options& o, const std::vector<Column>& cols,
                       const std::string& model) {
  OnnxExport out;
  const bool need_onnx = std::any_of(cols.begin(), cols.end(), [](const Column& c) {
    return c.runtime == "onnxruntime" || c.runtime.rfind("openvino", 0) == 0;
  });
  if (!need_onnx) return out;
  out.path = o.onnx;
  if (out.path.empty()) {
    std::error_code ec;
    std::string tmpl = (fs::temp_directory_path(ec) / "speed_check_onnx.XXXXXX").string();
    if (const char* d = ::mkdtemp(tmpl.data())) {
      out.dir = d;
      out.path = out.dir + "/" + fs::path(model).stem().string() + ".onnx";
      std::cerr << "speed_check: exporting " << fs::path(model).filename().string()
                << " to ONNX for the peers (tools/export_onnx.py) ..." << std::endl;
      const int rc = run_command({o.python, o.export_script, "--model", model, "--out", out.path});
      if (rc != 0) {
        out.reason = "the ONNX export failed (tools/export_onnx.py exit " + std::to_string(rc) +
                     "; its message is in the log)";
      }
    } else {
      out.reason = "no temporary folder for the ONNX export";
    }
  }
  if (out.reason.empty() && !fs::exists(out.path)) out.reason = "ONNX file not found: " + out.path;
  return out;
}

// The exporter's side file: its check of the export against the original (null without one).
json export_check(const OnnxExport& onnx) {
  if (onnx.path.empty() || !onnx.reason.empty()) return nullptr;
  std::ifstream side(onnx.path + ".json");
  return side ? json::parse(side, nullptr, false) : json(nullptr);
}

// The worker's command line: this program for the library's columns (with the load options of
// the command line), original_python.py or peers_python.py for the others.
std::vector<std::string> worker_argv(const Options& o, const Column& c, const std::string& model,
                                     const std::string& onnx) {
  std::vector<std::string> argv;
  const std::string repeats = std::to_string(o.load_repeats);
  if (!c.python) {
    argv = {fs::canonical("/proc/self/exe").string(),
            "--worker",
            "--model",
            model,
            "--worker-mode",
            c.mode,
            "--worker-dtype",
            c.dtype,
            "--load-repeats",
            repeats};
    for (auto& a : load_option_args(o)) argv.push_back(std::move(a));
    return argv;
  }
  if (!c.runtime.empty()) {
    argv = {o.python, o.peers_script, "--worker", "--runtime", c.runtime, "--model", model};
    if (c.runtime != "transformers") {
      argv.push_back("--onnx");
      argv.push_back(onnx);
    }
  } else {
    argv = {o.python, o.python_script, "--worker", "--model", model};
  }
  for (const std::string& a :
       {std::string("--device"), o.device, std::string("--load-repeats"), repeats}) {
    argv.push_back(a);
  }
  if (o.load.threads > 0) {
    argv.push_back("--threads");
    argv.push_back(std::to_string(o.load.threads));
  }
  return argv;
}

void start_workers(std::vector<Column>& cols, const Options& o, const std::string& model,
                   const OnnxExport& onnx) {
  for (auto& c : cols) {
    if (!c.runtime.empty() && c.runtime != "transformers" && !onnx.reason.empty()) {
      c.unavailable = onnx.reason;
      std::cerr << "speed_check: " << c.title << " unavailable: " << c.unavailable << "\n";
      continue;
    }
    std::cerr << "speed_check: loading " << c.title << " ..." << std::endl;
    try {
      c.child = std::make_unique<Child>(worker_argv(o, c, model, onnx.path));
      c.ready = c.child->read();
      if (c.ready.value("event", "") != "ready") {
        c.unavailable = c.ready.value("reason", "failed to start");
        c.child.reset();
      } else if (c.runtime == "openvino-default") {
        // Name the column after the precision OpenVINO chose for this CPU.
        const std::string p = c.ready.value("inference_precision", "");
        if (!p.empty()) c.title = "OpenVINO default (" + p + ")";
        c.dtype = c.ready["backend"].value("dtype", c.dtype);
      }
    } catch (const std::exception& e) {
      c.unavailable = e.what();
      c.child.reset();
    }
    if (!c.unavailable.empty())
      std::cerr << "speed_check:   unavailable: " << c.unavailable << "\n";
  }
}

// Every column's outputs for one synthetic image against the reference column's (the original in
// Python when it runs, else the original mode, else the first portable column): logits at the
// network's output size and labels at the image's size.
json compare_outputs(std::vector<Column>& cols, int h, int w) {
  std::error_code ec;
  std::string tmpl = (fs::temp_directory_path(ec) / "speed_check.XXXXXX").string();
  const char* dir = ::mkdtemp(tmpl.data());
  if (!dir) return json::object();
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  };
  std::map<std::string, std::pair<std::vector<char>, std::vector<char>>> got;
  for (auto& c : cols) {
    if (!c.child) continue;
    const std::string prefix = std::string(dir) + "/" + std::to_string(got.size());
    try {
      c.child->request({{"cmd", "outputs"}, {"height", h}, {"width", w}, {"prefix", prefix}});
      got[c.id] = {read(prefix + ".logits"), read(prefix + ".labels")};
    } catch (const std::exception& e) {
      std::cerr << "speed_check:   " << c.title << ": no outputs (" << e.what() << ")\n";
    }
    std::remove((prefix + ".logits").c_str());
    std::remove((prefix + ".labels").c_str());
  }
  ::rmdir(dir);
  // Against the original; without one (Sapiens2 has none), against the first portable column.
  std::string ref = got.count("original-python") ? "original-python" : "original";
  for (const auto& c : cols) {  // in column order (got is sorted by name)
    if (got.count(ref)) break;
    if (c.id.rfind("portable", 0) == 0 && got.count(c.id)) ref = c.id;
  }
  json out = {{"reference", ref}, {"height", h}, {"width", w}, {"columns", json::object()}};
  if (!got.count(ref)) return out;
  const auto& [rl, rb] = got[ref];
  for (const auto& [id, v] : got) {
    const auto& [l, b] = v;
    if (l.size() != rl.size() || b.size() != rb.size()) {
      out["columns"][id] = {{"error", "output shapes differ"}};
      continue;
    }
    const auto* x = reinterpret_cast<const float*>(l.data());
    const auto* y = reinterpret_cast<const float*>(rl.data());
    const size_t n = l.size() / sizeof(float);
    double max_diff = 0, sum_diff = 0;
    for (size_t i = 0; i < n; ++i) {
      const double d = std::abs(static_cast<double>(x[i]) - y[i]);
      max_diff = std::max(max_diff, d);
      sum_diff += d;
    }
    size_t same = 0;
    for (size_t i = 0; i < b.size(); ++i) same += b[i] == rb[i];
    out["columns"][id] = {
        {"max_abs_logit_diff", max_diff},
        {"mean_abs_logit_diff", n ? sum_diff / static_cast<double>(n) : 0.0},
        {"label_agreement",
         b.empty() ? 1.0 : static_cast<double>(same) / static_cast<double>(b.size())}};
  }
  return out;
}

// One image size and batch: first and warm-up calls, the timed rounds alternating between the
// workers, then each one's peaks. A column that fails is dropped from the rest of the run.
json time_config(std::vector<Column>& cols, const Options& o, const Options::Config& cfg) {
  const int h = cfg.h, w = cfg.w, batch = cfg.batch;
  std::cerr << "speed_check: " << h << "x" << w << " batch " << batch << std::endl;
  json entry = {{"height", h}, {"width", w}, {"batch", batch}, {"columns", json::object()}};
  std::map<std::string, std::vector<double>> round_medians, net_medians;
  std::map<std::string, json> per;
  auto fail = [&](Column& c, const std::exception& e) {
    std::cerr << "speed_check:   " << c.title << " failed: " << e.what() << "\n";
    per[c.id] = {{"error", e.what()}};
    c.child.reset();
    c.unavailable = std::string("failed during the run: ") + e.what();
  };
  for (auto& c : cols) {
    if (!c.child) continue;
    try {
      per[c.id] = c.child->request({{"cmd", "prepare"},
                                    {"height", h},
                                    {"width", w},
                                    {"batch", batch},
                                    {"warmup", o.warmup}});
      per[c.id]["rounds_ms"] = json::array();
      per[c.id]["rounds_net_ms"] = json::array();
      per[c.id]["rounds_cpu_ms"] = json::array();
      per[c.id]["background_cpus"] = json::array();
    } catch (const std::exception& e) {
      fail(c, e);
    }
  }
  for (int r = 0; r < o.rounds; ++r) {
    for (auto& c : cols) {
      if (!c.child) continue;
      try {
        const double background = wait_for_quiet(o.wait_quiet);
        const json got = c.child->request({{"cmd", "run"}, {"calls", o.calls}});
        const auto ms = got.at("ms").get<std::vector<double>>();
        per[c.id]["rounds_ms"].push_back(ms);
        if (got.contains("net_ms")) {
          const auto net = got["net_ms"].get<std::vector<double>>();
          per[c.id]["rounds_net_ms"].push_back(net);
          net_medians[c.id].push_back(median(net));
        }
        per[c.id]["rounds_cpu_ms"].push_back(got.value("cpu_ms", json::array()));
        per[c.id]["background_cpus"].push_back(background);
        round_medians[c.id].push_back(median(ms));
      } catch (const std::exception& e) {
        fail(c, e);
      }
    }
  }
  for (auto& c : cols) {
    if (!c.child) continue;
    try {
      per[c.id].update(c.child->request({{"cmd", "peak"}}));
      per[c.id]["median_ms"] = median(round_medians[c.id]);
      if (!net_medians[c.id].empty()) per[c.id]["median_net_ms"] = median(net_medians[c.id]);
      per[c.id]["min_ms"] =
          *std::min_element(round_medians[c.id].begin(), round_medians[c.id].end());
      std::cerr << "speed_check:   " << c.title << ": " << fmt(per[c.id]["median_ms"].get<double>())
                << " ms, peak RSS " << gib(per[c.id]["peak_rss"].get<double>()) << " GiB\n";
    } catch (const std::exception& e) {
      fail(c, e);
    }
  }
  for (auto& [id, j] : per) {
    if (!j.contains("error")) entry["columns"][id] = j;
  }
  return entry;
}

// Each column's CUDA-graph counts (from its last "peak" reply) and, with --split, its
// backbone/head split, both after every timed call.
void after_rounds(std::vector<Column>& cols, const Options& o, json& graphs, json& splits) {
  for (auto& c : cols) {
    if (!c.child) continue;
    try {
      const json g = c.child->request({{"cmd", "peak"}}).value("graphs", json());
      if (!g.is_null()) {
        graphs[c.id] = g;
        std::cerr << "speed_check:   " << c.title << " graphs: " << g.value("summary", "") << "\n";
      }
      // Only the C++ workers know the split (the Python ones answer "unknown command").
      if (o.split && !c.python) {
        splits[c.id] = c.child->request({{"cmd", "split"}});
        std::cerr << "speed_check:   " << c.title << " split: " << splits[c.id].dump() << "\n";
      }
    } catch (const std::exception& e) {
      std::cerr << "speed_check:   " << c.title << ": no graphs/split (" << e.what() << ")\n";
      if (o.split && !c.python) splits[c.id] = {{"error", e.what()}};
    }
  }
}

// What ran where: the machine, the versions, the protocol and the command.
json meta_of(const Options& o, const std::string& command, const std::string& model,
             const json& workers, const json& threads, const json& omp) {
  std::string torch_python;
  if (workers.contains("original-python"))
    torch_python = workers["original-python"].value("torch", "");
  json meta = {
      {"date", today()},
      {"cpu", cpu_model()},
      {"cores", std::thread::hardware_concurrency()},
      {"avx512_bf16", cpu_flag("avx512_bf16")},
      {"isa_flags", isa_flags()},
      {"cpu_id", cpu_identity()},
      {"cpu_gemm", cpu_gemm_line()},
      {"onednn_cap", std::getenv("ONEDNN_MAX_CPU_ISA") ? std::getenv("ONEDNN_MAX_CPU_ISA")
                     : std::getenv("DNNL_MAX_CPU_ISA") ? std::getenv("DNNL_MAX_CPU_ISA")
                                                       : ""},
      {"loadavg_at_end", loadavg()},
      {"device", o.device},
      {"torch", std::string(TORCH_VERSION) +
                    (torch_python.empty() ? "" : " (Python: " + torch_python + ")")},
      {"sapiens_seg", SAPIENS_SEG_VERSION},
      {"pipeline", library_pipeline()},
      {"model_file", fs::path(model).filename().string()},
      {"model_bytes", fs::file_size(model)},
      {"threads", threads},
      {"omp_num_threads", omp},
      {"quick", o.quick},
      {"quick_note",
       "the tiny_b fixture unless --model says otherwise (random weights, 2 blocks, 128 wide, a "
       "64-channel head): fast to run, not representative of full-size speed; " +
           std::to_string(o.configs.size()) + " sizes and batches, " + std::to_string(o.warmup) +
           " warm-up, " + std::to_string(o.rounds) + " rounds x " + std::to_string(o.calls) +
           " calls"},
      {"protocol",
       {{"warmup", o.warmup},
        {"rounds", o.rounds},
        {"calls", o.calls},
        {"load_repeats", o.load_repeats},
        {"wait_quiet_s", o.wait_quiet}}},
      {"command", command},
  };
  // Versions of everything that ran a column (torch, onnxruntime, openvino, transformers).
  json versions = {{"libtorch", TORCH_VERSION}};
  for (const auto& [id, w] : workers.items()) {
    if (w.contains("torch")) versions["torch (Python)"] = w["torch"];
    if (w.contains("versions")) versions.update(w["versions"]);
  }
  meta["versions"] = versions;
  return meta;
}

}  // namespace

int run_parent(const Options& o, const std::string& command, const char* argv0) {
  std::string model = o.model;
  if (model.empty()) model = o.quick ? find_quick_model(argv0) : "sapiens-seg-0.3b-goliath";
  model = resolve_model(model, o.load);
  if (!fs::exists(model)) throw std::runtime_error("model file not found: " + model);
  model = fs::absolute(model).string();

  const std::string load_at_start = loadavg();
  std::vector<Column> cols = plan_columns(o, fs::path(model).extension() == ".safetensors");
  const OnnxExport onnx = export_onnx(o, cols, model);
  start_workers(cols, o, model, onnx);

  const json accuracy = compare_outputs(cols, o.configs.front().h, o.configs.front().w);
  json results = json::array();
  for (const auto& cfg : o.configs) results.push_back(time_config(cols, o, cfg));
  json graphs = json::object(), splits = json::object();
  after_rounds(cols, o, graphs, splits);

  json columns = json::array(), load = json::object(), workers = json::object();
  json threads = json::object();
  json omp = nullptr;
  for (const auto& c : cols) {
    // A column whose worker never started (the peers without an ONNX export) has no reply.
    const bool ok = c.ready.is_object() && c.ready.value("event", "") == "ready";
    columns.push_back({{"id", c.id},
                       {"title", c.title},
                       {"mode", c.mode},
                       {"dtype", c.dtype},
                       {"runtime", c.runtime},
                       {"available", ok},
                       {"reason", c.unavailable}});
    if (ok) {
      load[c.id] = median(c.ready["load_ms"].get<std::vector<double>>());
      threads[c.id] = c.ready["threads"];
      omp = c.ready["omp_num_threads"];
      workers[c.id] = c.ready;
    }
  }
  json meta = meta_of(o, command, model, workers, threads, omp);
  meta["onnx_export"] = export_check(onnx);
  meta["loadavg_at_start"] = load_at_start;
  if (!onnx.dir.empty()) {
    std::error_code ec;
    fs::remove_all(onnx.dir, ec);  // the export and its external data
  }
  const json report = {{"meta", meta},          {"columns", columns}, {"load_ms", load},
                       {"accuracy", accuracy},  {"workers", workers}, {"results", results},
                       {"cuda_graphs", graphs}, {"split", splits}};
  // The result is JSON only; benchmarks/readme_performance.py renders it (one renderer for the
  // pages and for a look during a session: --print FILE).
  if (o.json_out.empty()) {
    std::cout << report.dump(2) << "\n";
  } else {
    std::ofstream(o.json_out) << report.dump(2) << "\n";
    std::cerr << "speed_check: wrote " << o.json_out << "; as tables: python "
              << "benchmarks/readme_performance.py --print " << o.json_out << "\n";
  }
  return 0;
}

}  // namespace speed_check
