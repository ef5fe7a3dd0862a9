// sapiens-seg: the command-line tool. stdout carries results, stderr logs and progress.
//
// Exit status: 0 success, 2 usage error, 128 + the signal when stopped (130 SIGINT, 129 SIGHUP,
// 143 SIGTERM, 141 for a closed stdout; see cli/stop.hpp), 10 + ErrorCode for library errors (11
// not found, 12 checksum mismatch, 13 download failed, 14 offline, 15 licence not accepted, 16
// backend unavailable, 17 invalid input, 18 format error, 19 I/O error, 20 internal error, 21 out
// of memory).

#include <algorithm>
#include <array>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/inputs.hpp"
#include "cli/json_paths.hpp"
#include "cli/naming.hpp"
#include "cli/option_flags.hpp"
#include "cli/segment.hpp"
#include "cli/stop.hpp"
#include "sapiens_seg/sapiens_seg.hpp"
#include "serve/command.hpp"

using namespace sapiens_seg;

namespace {

// Ctrl-C (or SIGTERM, SIGHUP) during a download: stop cleanly and keep the partial file for the
// next run.
std::atomic<bool>& g_cancel = cli::stop_flag();

void print_error(const Error& e) {
  std::fprintf(stderr, "sapiens-seg: error [%s]: %s\n", std::string(to_string(e.code())).c_str(),
               cli::plain_text(e.what(), /*keep_newlines=*/true).c_str());
}

std::string human_size(std::optional<std::uint64_t> bytes) {
  if (!bytes) return "size unknown";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(*bytes) / 1e9);
  return buf;
}

// The cards as an aligned table, then the card files that could not be read.
int run_models_list() {
  std::vector<std::array<std::string, 5>> rows = {{"ID", "LICENCE", "SIZE", "SHA-256", "WEIGHTS"}};
  for (const Card& c : list_cards()) {
    const WeightsStatus s = weights_status(c.id);
    std::string weights = "not downloaded";
    if (s.present && !s.problem.empty()) {
      weights = "BAD (" + s.problem + "): " + cli::plain_text(s.path);
    } else if (s.present) {
      weights =
          (s.verified ? "verified: " : "present, not verified yet: ") + cli::plain_text(s.path);
    }
    rows.push_back(
        {c.id, c.license_id + (c.commercial_use ? "" : " (non-commercial)"), human_size(c.size),
         c.sha256 ? c.sha256->substr(0, 12) + "..." : std::string("NOT PINNED"), weights});
  }
  std::array<std::size_t, 5> width{};
  for (const auto& r : rows) {
    for (std::size_t k = 0; k < r.size(); ++k) width[k] = std::max(width[k], r[k].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t k = 0; k < r.size(); ++k) {
      line += r[k];
      if (k + 1 < r.size()) line += std::string(width[k] - r[k].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
  for (const BrokenCard& b : broken_cards()) {
    std::cout << "BROKEN CARD " << cli::plain_text(b.path) << ": " << cli::plain_text(b.error)
              << "\n";
  }
  return 0;
}

int run_models_download(const std::string& id, bool use_hf_token) {
  const Card card = find_card(id);
  if (!card.commercial_use) {
    std::fprintf(stderr,
                 "note: %s is licensed %s (non-commercial use only); loading it needs "
                 "--accept-noncommercial or SAPIENS_SEG_NONCOMMERCIAL=1\n",
                 card.id.c_str(), card.license_id.c_str());
  }
  FetchOptions o;
  o.use_hf_token = use_hf_token;
  o.cancel = &g_cancel;
  std::cout << fetch(id, o) << "\n";
  return 0;
}

// `models verify [ID|PATH]`: re-hash the downloaded weights (all, one card's) or one checkpoint
// file, which also accepts a file without a card as it is now.
int run_models_verify(const std::string& id) {
  std::error_code ec;
  if (!id.empty() && std::filesystem::is_regular_file(id, ec)) {
    const WeightsStatus s = verify_file(id);
    std::cout << (s.id.empty() ? std::string("(no card)") : s.id) << "  "
              << (s.verified     ? "OK"
                  : s.id.empty() ? "RECORDED"
                                 : "UNPINNED")
              << "  sha256 " << s.sha256 << "  " << cli::plain_text(s.path) << "\n";
    if (s.id.empty()) {
      std::cerr << "sapiens-seg: " << cli::plain_text(s.path)
                << " matches no model card; its content is recorded as it is now, and later "
                   "loads refuse other content under this path\n";
    }
    return 0;
  }
  std::vector<std::string> ids;
  if (!id.empty()) {
    ids.push_back(id);
  } else {
    for (const Card& c : list_cards()) {
      if (weights_status(c.id).present) ids.push_back(c.id);
    }
  }
  int status = 0;
  for (const auto& i : ids) {
    try {
      const WeightsStatus s = verify(i);
      std::cout << i << "  " << (s.verified ? "OK" : "UNPINNED") << "  sha256 " << s.sha256 << "  "
                << cli::plain_text(s.path) << "\n";
    } catch (const Error& e) {
      std::cout << i << "  FAILED\n";
      print_error(e);
      if (status == 0) status = exit_status(e.code());
    }
  }
  if (ids.empty()) std::cerr << "no downloaded weights to verify\n";
  return status;
}

int run_models_path(const std::string& id) {
  const WeightsStatus s = weights_status(id);
  std::cout << cli::plain_text(s.path) << "\n";
  if (!s.present) {
    std::fprintf(stderr, "sapiens-seg: %s is not downloaded; this is where it would go\n",
                 s.id.c_str());
    return exit_status(ErrorCode::kNotFound);
  }
  return 0;
}

int run_models_rm(const std::string& id) {
  const WeightsStatus s = weights_status(id);
  if (!remove_weights(id)) {
    std::fprintf(stderr, "sapiens-seg: nothing of %s in the cache %s\n", s.id.c_str(),
                 (s.location.empty() || s.location == "cache"
                      ? std::string()
                      : "(its file is in " + s.location + ", which sapiens-seg never deletes)")
                     .c_str());
    return exit_status(ErrorCode::kNotFound);
  }
  std::cout << "removed " << s.id << "\n";
  return 0;
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : sep) + i;
  return out;
}

int run_info() {
  const SystemInfo s = system_info();
  std::cout << "sapiens-seg " << s.version << "\n"
            << "libtorch    " << s.torch_version << "\n"
            << "opencv      " << s.opencv_version << "\n"
            << "openssl     " << s.openssl_version << "\n"
            << "cpu         " << s.cpu_model << " (" << s.cpu_id << ")\n"
            << "cpu flags   " << join(s.cpu_flags, " ")
            << (s.onednn_cap.empty() ? "" : " (oneDNN capped: " + s.onednn_cap + ")") << "\n"
            << "cpu threads " << s.threads << "\n"
            << "cuda        "
            << (s.cuda_available ? std::to_string(s.cuda_devices) + " device(s)" : "no device")
            << "\n"
            << "backends:\n";
  for (const auto& b : s.backends) std::cout << "  " << b << "\n";
  std::cout << "cpu dtypes (portable):\n";
  for (const auto& d : s.cpu_dtypes) std::cout << "  " << d << "\n";
  std::cout << "cpu attention (portable):\n";
  for (const auto& d : s.cpu_attention) std::cout << "  " << d << "\n";
  std::cout << "cpu gemm (portable):\n  " << s.cpu_gemm << "\n";
  std::cout << "cv2 cubic   " << s.wheel_cubic_path
            << " (the opencv-python wheel's INTER_CUBIC code path on this CPU; reproduced)\n";
  std::cout << "card folders:\n";
  for (const auto& d : s.card_dirs) std::cout << "  " << d << "\n";
  return 0;
}

// `sapiens-seg segment`: its flags, the library's load and run options among them.
CLI::App* add_segment_command(CLI::App& app, cli::SegmentArgs& seg,
                              cli::OptionValues& seg_options) {
  auto* s = app.add_subcommand(
      "segment",
      "segment images, folders, lists (@file, -) and videos; write labels, overlays, "
      ".npy files and a summary");
  s->add_option("inputs", seg.inputs, "image or video files, folders, @list.txt, or - for stdin")
      ->required();
  s->add_option("-o,--output", seg.out_dir, "output folder")->required();
  s->add_option("-m,--model", seg.model, "card id (see `models`) or checkpoint path")
      ->capture_default_str();
  // Every load and run option of the library, by its table (names.hpp); the segment options
  // are --save items (logits, raw_logits).
  cli::add_option_flags(*s, {OptionGroup::kLoad, OptionGroup::kRun}, seg_options);
  s->add_option("--workers", seg.workers, "decode threads and writer threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  s->add_flag("-r,--recursive", seg.recursive, "search folders recursively");
  seg.extensions = cli::extension_list(cli::image_extensions()) + "," +
                   cli::extension_list(cli::video_extensions());
  s->add_option("--ext", seg.extensions, "file extensions taken from folders")
      ->capture_default_str();
  std::string save_help = "outputs, any of:";
  for (const auto& item : cli::save_items()) save_help += " " + item;
  s->add_option("--save", seg.save, save_help)->capture_default_str();
  s->add_option("--overlay", seg.overlay_style,
                "blend, or side-by-side (input | overlay, under the input's name, as the "
                "authors' demo)")
      ->check(CLI::IsMember({"blend", "side-by-side"}))
      ->capture_default_str();
  s->add_option("--opacity", seg.opacity, "overlay opacity")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  s->add_option("--stride", seg.stride, "videos: segment every Nth frame")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  s->add_option("--codec", seg.codec,
                "overlay video codec: h264 (plays in browsers), mp4v (MPEG-4 Part 2), or auto "
                "(h264 where this OpenCV/FFmpeg can encode it, else mp4v, said in the log and "
                "summary)")
      ->check(CLI::IsMember({"auto", "h264", "mp4v"}))
      ->capture_default_str();
  s->add_flag("--json", seg.json_lines, "print one JSON line per input on stdout");
  s->add_flag("-q,--quiet", seg.quiet, "no progress bar or per-input lines; errors only");
  s->add_flag("--skip-existing", seg.skip_existing,
              "skip inputs whose selected outputs exist (resume a folder run)");

  return s;
}

// `sapiens-seg models list|download|verify|path|rm`.
struct ModelsCommand {
  CLI::App* app = nullptr;
  CLI::App *download = nullptr, *verify = nullptr, *path = nullptr, *rm = nullptr;
  std::string model_id;
  bool use_hf_token = false;
};

void add_models_command(CLI::App& app, ModelsCommand& c) {
  c.app = app.add_subcommand("models", "list, download, verify and remove model weights");
  c.app->add_subcommand("list", "the model cards and whether their weights are here (default)");
  c.download = c.app->add_subcommand("download", "download and verify a model's weights");
  c.download->add_option("id", c.model_id, "card id")->required();
  c.download->add_flag("--use-hf-token", c.use_hf_token,
                       "send $HF_TOKEN (also SAPIENS_SEG_USE_HF_TOKEN=1)");
  c.verify = c.app->add_subcommand(
      "verify",
      "re-hash downloaded weights (all, or one id), or a checkpoint file (PATH): this also "
      "accepts the new content of a file without a card");
  c.verify->add_option("id", c.model_id, "card id or checkpoint path");
  c.path = c.app->add_subcommand("path", "print where a model's weights are (or would go)");
  c.path->add_option("id", c.model_id, "card id")->required();
  c.rm = c.app->add_subcommand("rm", "delete a model's weights from the cache");
  c.rm->add_option("id", c.model_id, "card id")->required();
  c.app->require_subcommand(0, 1);
}

int run_models(const ModelsCommand& c) {
  if (c.download->parsed()) return run_models_download(c.model_id, c.use_hf_token);
  if (c.verify->parsed()) return run_models_verify(c.model_id);
  if (c.path->parsed()) return run_models_path(c.model_id);
  if (c.rm->parsed()) return run_models_rm(c.model_id);
  return run_models_list();
}

// A command that failed: its message and exit status; a Ctrl-C during a download is a cancel.
int report_failure(const std::exception_ptr& failure) {
  const Error e = as_error(failure, "sapiens-seg");
  // Ctrl-C while the weights download: a cancel, not a failure (the .part file is kept).
  if (g_cancel) {
    const std::string what = e.what();
    std::fprintf(stderr, "sapiens-seg: interrupted by %s (%s)%s\n", cli::stop_reason().c_str(),
                 cli::plain_text(what.substr(0, what.find('\n'))).c_str(),
                 e.code() == ErrorCode::kDownloadFailed
                     ? "; the partial download is kept and the next run resumes it"
                     : "");
    return 128 + (cli::stop_signal() ? cli::stop_signal() : SIGINT);
  }
  print_error(e);
  return exit_status(e.code());
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"sapiens-seg: Sapiens human body-part segmentation"};
  app.require_subcommand(1);
  // Global flags (-v, -q) are accepted after the subcommand too: options a subcommand does not
  // know fall through to its parent. Subcommands inherit this when they are created.
  app.fallthrough();
  app.set_version_flag("--version", std::string(version()));
  bool verbose = false, quiet = false;
  app.add_flag("-v,--verbose", verbose, "log loading and backend choices");
  app.add_flag("-q,--quiet", quiet, "log errors only");

  cli::SegmentArgs seg;
  cli::OptionValues seg_options;
  CLI::App* s = add_segment_command(app, seg, seg_options);
  ModelsCommand models;
  add_models_command(app, models);
  auto* info = app.add_subcommand("info", "versions, threads and backends of this machine");
  serve::ServeCommand serve_command;
  auto* sv = serve::add_serve_command(app, serve_command);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (quiet) sapiens_seg::set_log_level(sapiens_seg::LogLevel::kError);
  if (verbose) sapiens_seg::set_log_level(sapiens_seg::LogLevel::kInfo);
  try {
    if (s->parsed()) {
      cli::install_stop_handlers();
      seg.quiet = seg.quiet || quiet;
      if (seg.quiet) sapiens_seg::set_log_level(sapiens_seg::LogLevel::kError);
      LoadOptions load_options = cli::load_options(seg_options);
      load_options.fetch.cancel = &g_cancel;
      seg.run = cli::run_options(seg_options);
      return cli::run_segment(seg, load_options);
    }
    if (models.app->parsed()) {
      cli::install_stop_handlers();
      return run_models(models);
    }
    if (info->parsed()) return run_info();
    if (sv->parsed()) return serve::run_serve(serve_command);
  } catch (...) {
    return report_failure(std::current_exception());
  }
  return 0;
} catch (...) {  // setting up the parser itself failed
  const Error e = as_error(std::current_exception(), "sapiens-seg");
  print_error(e);
  return exit_status(e.code());
}
