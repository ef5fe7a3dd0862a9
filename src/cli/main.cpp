// sapiens-seg: the command-line tool. stdout carries results, stderr logs and progress.
//
// Exit status: 0 success, 2 usage error, 10 + ErrorCode for library errors (11 not found,
// 12 checksum mismatch, 13 download failed, 14 offline, 15 licence not accepted, 16 backend
// unavailable, 17 invalid input, 18 format error, 19 I/O error, 20 internal error).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/outputs.hpp"
#include "io/npy.hpp"
#include "sapiens_seg/sapiens_seg.hpp"

namespace fs = std::filesystem;
using namespace sapiens_seg;

namespace {

int exit_code(ErrorCode c) {
  return 10 + static_cast<int>(c);
}

void print_error(const Error& e) {
  std::fprintf(stderr, "sapiens-seg: error [%s]: %s\n", std::string(to_string(e.code())).c_str(),
               e.what());
}

struct SegmentArgs {
  std::vector<std::string> images;
  std::string out_dir;
  std::string model = "sapiens-seg-0.3b-goliath";
  std::string mode = "auto", device, dtype = "default", normalization = "demo";
  int batch = 1;
  int threads = 0;
  float opacity = 0.5f;
  bool accept_nc = false, allow_unverified = false;
};

LoadOptions load_options(const SegmentArgs& a) {
  static const std::map<std::string, Mode> modes = {{"auto", Mode::kAuto},
                                                    {"portable", Mode::kPortable},
                                                    {"kernels", Mode::kKernels},
                                                    {"original", Mode::kOriginal}};
  static const std::map<std::string, DType> dtypes = {{"default", DType::kDefault},
                                                      {"float32", DType::kFloat32},
                                                      {"float16", DType::kFloat16},
                                                      {"bfloat16", DType::kBFloat16}};
  LoadOptions o;
  o.mode = modes.at(a.mode);
  o.device = a.device;
  o.dtype = dtypes.at(a.dtype);
  o.normalization = a.normalization == "training" ? Normalization::kTraining : Normalization::kDemo;
  o.accept_noncommercial = a.accept_nc;
  o.allow_unverified = a.allow_unverified;
  o.threads = a.threads;
  return o;
}

// Fails early (before loading gigabytes) when the output folder cannot be written.
void prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::kIo, "cannot create output folder " + dir + ": " + ec.message());
  const std::string probe = (fs::path(dir) / ".sapiens-seg-write-test").string();
  io::write_file_atomic(probe, "", 0);
  fs::remove(probe, ec);
}

int run_segment(const SegmentArgs& a) {
  prepare_out_dir(a.out_dir);
  const Model model = load(a.model, load_options(a));
  const bool tty = isatty(fileno(stderr)) != 0;
  nlohmann::json summary = {{"model", model.info().id},
                            {"checkpoint", model.info().path},
                            {"version", version()},
                            {"backend",
                             {{"mode", model.info().backend.mode},
                              {"device", model.info().backend.device},
                              {"dtype", model.info().backend.dtype}}},
                            {"images", nlohmann::json::array()}};
  int status = 0;
  std::set<std::string> stems;
  const std::size_t n = a.images.size();
  for (std::size_t start = 0; start < n; start += static_cast<std::size_t>(a.batch)) {
    const std::size_t end = std::min(n, start + static_cast<std::size_t>(a.batch));
    std::vector<Image> images;
    std::vector<std::size_t> index;
    std::vector<double> decode_ms;
    for (std::size_t i = start; i < end; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        images.push_back(read_image(a.images[i]));
        index.push_back(i);
        decode_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      } catch (const Error& e) {
        // One bad image does not cost the others their results.
        print_error(e);
        summary["images"].push_back({{"input", a.images[i]},
                                     {"error", std::string(to_string(e.code()))},
                                     {"message", e.what()}});
        if (status == 0) status = exit_code(e.code());
      }
    }
    if (images.empty()) continue;
    std::vector<Input> inputs;
    for (const auto& img : images) inputs.push_back(Input::rgb(img.view()));
    std::vector<Result> results = model.segment(inputs);
    for (std::size_t j = 0; j < results.size(); ++j) {
      const std::string& path = a.images[index[j]];
      std::string stem = fs::path(path).stem().string();
      for (int k = 2; stems.count(stem); ++k)
        stem = fs::path(path).stem().string() + "_" + std::to_string(k);
      stems.insert(stem);
      results[j].timings.decode = decode_ms[j];
      nlohmann::json entry = cli::write_outputs(results[j], images[j], a.out_dir, stem, a.opacity);
      entry["input"] = path;
      std::cout << path << " -> " << (fs::path(a.out_dir) / stem).string() << "_seg.png ("
                << results[j].width << "x" << results[j].height << ", "
                << static_cast<int>(results[j].timings.network) << " ms network)\n";
      summary["images"].push_back(std::move(entry));
    }
    if (tty) std::fprintf(stderr, "\r[%zu/%zu] images segmented", end, n);
  }
  if (tty) std::fprintf(stderr, "\n");
  const std::string text = summary.dump(2) + "\n";
  io::write_file_atomic((fs::path(a.out_dir) / "summary.json").string(), text.data(), text.size());
  return status;
}

int run_models() {
  for (const Card& c : list_cards()) {
    std::cout << c.id << "  " << c.family << "  " << c.license_id
              << (c.commercial_use ? "" : " (non-commercial)") << "  "
              << (c.size ? std::to_string(*c.size / 1000000) + " MB" : std::string("size unknown"))
              << "  sha256 "
              << (c.sha256 ? c.sha256->substr(0, 12) + "..." : std::string("NOT PINNED")) << "\n";
  }
  return 0;
}

int run_info() {
  const SystemInfo s = system_info();
  std::cout << "sapiens-seg " << s.version << "\n"
            << "libtorch    " << s.torch_version << "\n"
            << "opencv      " << s.opencv_version << "\n"
            << "openssl     " << s.openssl_version << "\n"
            << "cpu threads " << s.threads << "\n"
            << "cuda        "
            << (s.cuda_available ? std::to_string(s.cuda_devices) + " device(s)" : "no device")
            << "\n"
            << "backends:\n";
  for (const auto& b : s.backends) std::cout << "  " << b << "\n";
  std::cout << "card folders:\n";
  for (const auto& d : s.card_dirs) std::cout << "  " << d << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sapiens-seg: Sapiens human body-part segmentation"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(version()));
  bool verbose = false, quiet = false;
  app.add_flag("-v,--verbose", verbose, "log loading and backend choices");
  app.add_flag("-q,--quiet", quiet, "log errors only");

  SegmentArgs seg;
  auto* s =
      app.add_subcommand("segment", "segment images and write labels, overlays and .npy files");
  s->add_option("images", seg.images, "image files")->required()->check(CLI::ExistingFile);
  s->add_option("-o,--output", seg.out_dir, "output folder")->required();
  s->add_option("-m,--model", seg.model, "card id (see `models`) or checkpoint path")
      ->capture_default_str();
  s->add_option("--mode", seg.mode, "backend")
      ->check(CLI::IsMember({"auto", "portable", "kernels", "original"}))
      ->capture_default_str();
  s->add_option("--device", seg.device, "cpu, cuda or cuda:N (default: cuda when present)");
  s->add_option("--dtype", seg.dtype, "compute precision")
      ->check(CLI::IsMember({"default", "float32", "float16", "bfloat16"}))
      ->capture_default_str();
  s->add_option("--normalization", seg.normalization,
                "mean/std: the authors' demo or training values")
      ->check(CLI::IsMember({"demo", "training"}))
      ->capture_default_str();
  s->add_option("--batch", seg.batch, "images per network call")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  s->add_option("--threads", seg.threads, "CPU threads (0 = one per core)")
      ->check(CLI::NonNegativeNumber);
  s->add_option("--opacity", seg.opacity, "overlay opacity")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  s->add_flag("--accept-noncommercial", seg.accept_nc,
              "accept the CC-BY-NC-4.0 licence of the Sapiens v1 weights");
  s->add_flag("--allow-unverified", seg.allow_unverified,
              "load weights whose card has no pinned SHA-256");

  auto* m = app.add_subcommand("models", "list the model cards");
  m->add_subcommand("list", "list the model cards (default)");
  auto* info = app.add_subcommand("info", "versions, threads and backends of this machine");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (quiet) setenv("SAPIENS_SEG_LOG", "error", 1);
  if (verbose) setenv("SAPIENS_SEG_LOG", "info", 1);
  try {
    if (s->parsed()) return run_segment(seg);
    if (m->parsed()) return run_models();
    if (info->parsed()) return run_info();
  } catch (const Error& e) {
    print_error(e);
    return exit_code(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sapiens-seg: error [internal_error]: %s\n", e.what());
    return exit_code(ErrorCode::kInternal);
  }
  return 0;
}
