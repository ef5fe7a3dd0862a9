#include "cli/report.hpp"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "cli/json_paths.hpp"
#include "cli/naming.hpp"
#include "cli/stop.hpp"

namespace sapiens_seg::cli {
namespace fs = std::filesystem;

void Reporter::set_total(std::size_t total) {
  std::lock_guard<std::mutex> lock(mu_);
  total_ = total;
}

void Reporter::ok(const std::string& input, nlohmann::json entry) {
  put_path(entry, "input", input);
  entry["status"] = "ok";
  std::lock_guard<std::mutex> lock(mu_);
  if (args_.json_lines) {
    out(dump_json(entry));
  } else if (!args_.quiet) {
    clear_bar();
    std::string line = plain_text(input) + " -> " + plain_text(first_output(entry)) + " (" +
                       std::to_string(entry.value("width", 0)) + "x" +
                       std::to_string(entry.value("height", 0)) + ")";
    if (entry.contains("warnings")) {
      for (const auto& w : entry["warnings"])
        line += " [warning: " + plain_text(w.get<std::string>()) + "]";
    }
    out(line);
  }
  summary_.push_back(dump_json(entry));
  ++done_;
  draw();
}

void Reporter::failed(const std::string& input, const Error& e) {
  nlohmann::json entry = nlohmann::json::object();
  put_path(entry, "input", input);
  entry["status"] = "error";
  entry["error"] = std::string(to_string(e.code()));
  entry["message"] = display_text(e.what());  // the message names the path too
  std::lock_guard<std::mutex> lock(mu_);
  clear_bar();
  std::fprintf(stderr, "sapiens-seg: error [%s]: %s\n", std::string(to_string(e.code())).c_str(),
               plain_text(e.what()).c_str());
  if (args_.json_lines) out(dump_json(entry));
  summary_.push_back(dump_json(entry));
  if (status_ == 0) status_ = exit_status(e.code());
  ++done_;
  ++failed_;
  draw();
}

void Reporter::skipped(const std::string& input) {
  nlohmann::json entry = nlohmann::json::object();
  put_path(entry, "input", input);
  entry["status"] = "skipped";
  std::lock_guard<std::mutex> lock(mu_);
  if (args_.json_lines) out(dump_json(entry));
  skipped_.push_back(std::move(entry));
  ++done_;
  draw();
}

void Reporter::run_failed(const Error& e) {
  std::lock_guard<std::mutex> lock(mu_);
  clear_bar();
  std::fprintf(stderr, "sapiens-seg: error [%s]: %s\n", std::string(to_string(e.code())).c_str(),
               plain_text(e.what(), /*keep_newlines=*/true).c_str());
  if (status_ == 0) status_ = exit_status(e.code());
}

void Reporter::frames(const std::string& input, std::int64_t done, std::int64_t total) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!tty_) return;
  std::fprintf(stderr, "\r%s: frame %lld/%lld ",
               plain_text(fs::path(input).filename().string()).c_str(),
               static_cast<long long>(done), static_cast<long long>(total));
  std::fflush(stderr);
  bar_shown_ = true;
}

void Reporter::warn(const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (args_.quiet) return;
  clear_bar();
  std::fprintf(stderr, "sapiens-seg: warning: %s\n", plain_text(message).c_str());
  bar_shown_ = false;
}

void Reporter::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (bar_shown_) std::fputc('\n', stderr);
  bar_shown_ = false;
}

void Reporter::out(const std::string& line) {
  if (!std::cout.good()) return;
  std::cout << line << "\n" << std::flush;
  if (!std::cout.good()) request_stop(SIGPIPE);
}

std::string Reporter::first_output(const nlohmann::json& e) {
  if (!e.contains("outputs")) return "(no outputs selected)";
  for (const OutputKind& k : output_kinds()) {
    if (e["outputs"].contains(k.key)) return e["outputs"][k.key].get<std::string>();
  }
  return "(no outputs selected)";
}

void Reporter::clear_bar() {
  if (bar_shown_) std::fprintf(stderr, "\r%*s\r", 78, "");
}

void Reporter::draw() {
  if (!tty_) return;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = secs > 0 ? static_cast<double>(done_) / secs : 0;
  const double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : 0;
  const int filled = total_ ? static_cast<int>(24 * done_ / total_) : 24;
  std::fprintf(stderr, "\r[%s%s] %zu/%zu inputs%s %5.1f/s ETA %d:%02d ",
               std::string(static_cast<std::size_t>(filled), '#').c_str(),
               std::string(static_cast<std::size_t>(24 - filled), '-').c_str(), done_, total_,
               failed_ ? (" (" + std::to_string(failed_) + " failed)").c_str() : "", rate,
               static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
  std::fflush(stderr);
  bar_shown_ = true;
}

}  // namespace sapiens_seg::cli
