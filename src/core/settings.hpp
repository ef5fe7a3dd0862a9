// The library's configuration from the environment: one struct, filled by one function, the only
// place of src/ and python/src that reads environment variables (tests/cpp/test_settings.cpp
// holds it to that). Each field's variable, default and read time are in the table of
// include/sapiens_seg/settings.hpp and docs/configuration.md.
//
// read_settings() reads every variable anew, so the caller sees the environment as it is now:
// the weight store, the downloader and the log call it each time they need a value (Python users
// and the tests set variables after import and expect the next call to see them). The CPU
// dispatch overrides that are read "once per process" are read through it too, by their users'
// function-local statics (cpu/cpuinfo.cpp, resize/wheel_cubic.cpp), as before.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "sapiens_seg/log.hpp"

namespace sapiens_seg::core {

// A whole-number variable. A malformed or out-of-range value is refused where the number is
// used (value()), not when the environment is read, so that a bad download tuning variable
// fails the download and not every call.
struct WholeNumber {
  const char* name = "";
  std::string text;  // as set ("" when unset)
  long fallback = 0, lo = 0, hi = 0;
  // `fallback` when unset; an Error (kInvalidInput) naming the variable and the range when the
  // text is not a whole number from lo to hi.
  long value() const;
};

struct Settings {
  // ---- model cards and weights
  std::vector<std::filesystem::path> card_dirs;  // SAPIENS_SEG_CARDS, ':'-separated, empties out
  std::filesystem::path weights_path;            // SAPIENS_SEG_WEIGHTS_PATH ("" unset)
  std::filesystem::path cache_home;              // SAPIENS_SEG_HOME ("" unset)
  std::filesystem::path xdg_cache_home;          // XDG_CACHE_HOME ("" unset)
  std::filesystem::path home;                    // HOME ("" unset)
  std::filesystem::path hf_hub_cache;            // HF_HUB_CACHE ("" unset)
  std::filesystem::path hf_home;                 // HF_HOME ("" unset)
  bool accept_noncommercial = false;             // SAPIENS_SEG_NONCOMMERCIAL
  bool allow_unverified = false;                 // SAPIENS_SEG_ALLOW_UNVERIFIED

  // ---- downloads (flags: "1", "true", "yes" or "on", any case)
  bool offline = false;         // SAPIENS_SEG_OFFLINE
  bool hf_hub_offline = false;  // HF_HUB_OFFLINE
  std::string hf_endpoint;      // HF_ENDPOINT, as set ("" unset)
  std::string hf_token;         // HF_TOKEN ("" unset)
  bool use_hf_token = false;    // SAPIENS_SEG_USE_HF_TOKEN
  WholeNumber download_retries{"SAPIENS_SEG_DOWNLOAD_RETRIES", "", 5, 0, 100};
  WholeNumber retry_base_ms{"SAPIENS_SEG_RETRY_BASE_MS", "", 1000, 0, 600000};
  WholeNumber low_speed_time{"SAPIENS_SEG_LOW_SPEED_TIME", "", 60, 1, 86400};

  // ---- the log: SAPIENS_SEG_LOG (debug, info, error, quiet; unset or anything else: warn)
  LogLevel log_level = LogLevel::kWarn;

  // ---- CPU dispatch overrides, as set ("" unset); their users check the values
  std::string cpu_gemm;                   // SAPIENS_SEG_CPU_GEMM
  std::string cpu_head;                   // SAPIENS_SEG_CPU_HEAD
  std::string cpu_winograd;               // SAPIENS_SEG_CPU_WINOGRAD
  std::string cpu_attention;              // SAPIENS_SEG_CPU_ATTENTION
  std::string cpu_fuse;                   // SAPIENS_SEG_CPU_FUSE
  std::string cpu_mlp_columns;            // SAPIENS_SEG_CPU_MLP_COLUMNS
  std::optional<std::string> cpu_flags;   // SAPIENS_SEG_CPU_FLAGS (set, even empty, replaces)
  std::optional<std::string> cpu_vendor;  // SAPIENS_SEG_CPU_VENDOR (set, even empty, replaces)
  std::string onednn_max_cpu_isa;         // ONEDNN_MAX_CPU_ISA
  std::string dnnl_max_cpu_isa;           // DNNL_MAX_CPU_ISA
  std::string opencv_ipp;                 // OPENCV_IPP
};

// The environment as it is now.
Settings read_settings();

}  // namespace sapiens_seg::core
