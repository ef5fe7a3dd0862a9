// speed_check's command line: the benchmark's own flags (what to time and how often), and every
// load option of the library's option table (sapiens_seg/names.hpp) by its command-line name, so a
// new library option reaches the library columns without a change here.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "sapiens_seg/options.hpp"

namespace speed_check {

struct Options {
  bool quick = false, worker = false, split = false;
  std::string model, python, python_script, peers_script, onnx, export_script;
  bool modes_given = false;
  std::vector<std::string> modes, dtypes;
  struct Config {
    int h, w, batch;
  };
  std::vector<Config> configs;
  int warmup = 3, rounds = 3, calls = 5, load_repeats = 3;
  double wait_quiet = 0;  // seconds to wait, before each timed round, for other jobs to calm down
  std::string json_out;

  // The load options given (option-table names and their text, in the order given; `device`
  // always, "cpu" unless given). Each C++ worker gets them all; `mode` and `dtype` are each
  // column's own (--modes, --dtype).
  std::vector<std::pair<std::string, std::string>> load_options;
  sapiens_seg::LoadOptions load;  // those options applied: device, threads, ... for the parent
  std::string device = "cpu";     // load.device

  // A worker's column (set by the parent): a mode of --modes and a dtype.
  std::string worker_mode, worker_dtype;
};

// `command` gets the command as typed, minus this machine's directories (results are committed).
// Throws std::invalid_argument or sapiens_seg::Error (a bad load option's value) with a message
// for the user.
Options parse_args(int argc, char** argv, std::string& command);

// The worker command-line arguments that carry `options`' load options (the parent's to its C++
// workers).
std::vector<std::string> load_option_args(const Options& options);

// The options' load options applied to LoadOptions (set_option, in order).
sapiens_seg::LoadOptions apply_load_options(
    const std::vector<std::pair<std::string, std::string>>& options);

bool is_cuda(const std::string& device);

}  // namespace speed_check
