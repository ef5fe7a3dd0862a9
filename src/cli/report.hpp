// What a `segment` run reports, from several threads at once: one stdout line (or JSON line) per
// input, errors on stderr, the progress bar on a terminal, the summary entries, the exit status.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/segment.hpp"
#include "sapiens_seg/error.hpp"

namespace sapiens_seg::cli {

class Reporter {
 public:
  Reporter(std::size_t total, const SegmentArgs& args)
      : total_(total), args_(args), tty_(isatty(fileno(stderr)) != 0 && !args.quiet) {}

  void set_total(std::size_t total);
  void ok(const std::string& input, nlohmann::json entry);
  void failed(const std::string& input, const Error& e);
  void skipped(const std::string& input);

  // A failure of the run itself (not of one input): reported once, sets the exit status.
  void run_failed(const Error& e);

  // Progress inside one video, in frames.
  void frames(const std::string& input, std::int64_t done, std::int64_t total);

  // A warning that belongs to the run (not to one input); errors only (--quiet) drops it.
  void warn(const std::string& message);

  void finish();

  int status() const { return status_; }
  std::size_t failed_count() const { return failed_; }
  // Entries of the inputs this run segmented or failed, in the order they finished, each as its
  // compact JSON text: a parsed nlohmann::json entry costs ~10x its text (a node per value), and
  // a folder run of millions of images must not grow by kilobytes per image.
  const std::vector<std::string>& summary() const { return summary_; }
  // {"input": ..., "status": "skipped"} of the inputs --skip-existing passed over.
  const nlohmann::json& skipped_entries() const { return skipped_; }

 private:
  // One line on stdout. A reader that has gone (`--json | head -1`) stops the run as a signal
  // does: SIGPIPE is ignored (stop.hpp), so the write fails with EPIPE instead of killing us.
  void out(const std::string& line);
  static std::string first_output(const nlohmann::json& e);
  void clear_bar();
  void draw();

  std::mutex mu_;
  std::size_t total_, done_ = 0, failed_ = 0;
  const SegmentArgs& args_;
  bool tty_, bar_shown_ = false;
  int status_ = 0;
  std::vector<std::string> summary_;
  nlohmann::json skipped_ = nlohmann::json::array();
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace sapiens_seg::cli
