#include "settings.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "sapiens_seg/error.hpp"
#include "sapiens_seg/settings.hpp"

namespace sapiens_seg {
namespace {

struct Variable {
  std::string_view name, meaning, default_value, read;
};

constexpr std::string_view kEachCall = "each call";
constexpr std::string_view kOnce = "once per process";

// The table of include/sapiens_seg/settings.hpp and docs/configuration.md. A variable is read
// only through Environment below, which knows no other name.
constexpr std::array kVariables{
    // ---- model cards and weights
    Variable{"SAPIENS_SEG_CARDS",
             "Extra model-card folders, `:`-separated, searched before the bundled cards (a card "
             "there overrides a bundled card of the same id)",
             "none: the bundled cards only", kEachCall},
    Variable{"SAPIENS_SEG_WEIGHTS_PATH",
             "A folder of hand-placed weight files, looked in before the project cache", "none",
             kEachCall},
    Variable{"SAPIENS_SEG_HOME",
             "The project cache: downloaded weights (`weights/`), verification stamps "
             "(`stamps/`), licence notices already shown (`notices/`)",
             "`$XDG_CACHE_HOME/sapiens-seg`, else `~/.cache/sapiens-seg`", kEachCall},
    Variable{"XDG_CACHE_HOME", "The folder of the default project cache", "`~/.cache`", kEachCall},
    Variable{"HOME", "`~` in the defaults of the project and Hugging Face caches",
             "`.` (the working folder)", kEachCall},
    Variable{"HF_HUB_CACHE",
             "The Hugging Face hub cache: a file the Hugging Face tools downloaded there is "
             "reused (verified) instead of downloaded again",
             "`$HF_HOME/hub`, else `~/.cache/huggingface/hub`", kEachCall},
    Variable{"HF_HOME", "The Hugging Face home, whose `hub/` is the hub cache",
             "`~/.cache/huggingface`", kEachCall},
    Variable{"SAPIENS_SEG_NONCOMMERCIAL",
             "`1` accepts the CC-BY-NC-4.0 licence of the Sapiens v1 weights, as "
             "`LoadOptions::accept_noncommercial` and `--accept-noncommercial` do",
             "off: such a model is refused with `license_not_accepted`", kEachCall},
    Variable{"SAPIENS_SEG_ALLOW_UNVERIFIED",
             "`1` loads and downloads a model whose card pins no SHA-256 (its computed hash is "
             "logged), as `LoadOptions::allow_unverified` and `--allow-unverified` do",
             "off: such a model is refused with `checksum_mismatch`", kEachCall},
    // ---- downloads
    Variable{"SAPIENS_SEG_OFFLINE",
             "`1` never opens a connection: a missing file is an `offline` error naming the file, "
             "its SHA-256, its URL and the folder to put it in",
             "off", kEachCall},
    Variable{"HF_HUB_OFFLINE", "`1`: as `SAPIENS_SEG_OFFLINE` (the Hugging Face tools' switch)",
             "off", kEachCall},
    Variable{"HF_ENDPOINT", "The Hugging Face Hub, or a mirror of it, that weights come from",
             "`https://huggingface.co`", kEachCall},
    Variable{"HF_TOKEN",
             "A Hugging Face token, sent as a bearer token only with `SAPIENS_SEG_USE_HF_TOKEN=1` "
             "(or `FetchOptions::use_hf_token`, `--use-hf-token`), never to another host after a "
             "redirect",
             "none", kEachCall},
    Variable{"SAPIENS_SEG_USE_HF_TOKEN", "`1` sends `HF_TOKEN` with downloads",
             "off: a token in the environment is never sent", kEachCall},
    Variable{"SAPIENS_SEG_DOWNLOAD_RETRIES",
             "Retries of a transfer after a network error or an HTTP 5xx, 408 or 429 answer: a "
             "whole number from 0 to 100 (another value fails the download with `invalid_input`)",
             "`5`", kEachCall},
    Variable{"SAPIENS_SEG_RETRY_BASE_MS",
             "The first wait before a retry, in milliseconds (0 to 600000), doubled at each retry "
             "up to 30 s",
             "`1000`", kEachCall},
    Variable{"SAPIENS_SEG_LOW_SPEED_TIME",
             "Seconds under 1 KB/s after which a transfer counts as stalled and is retried (1 to "
             "86400)",
             "`60`", kEachCall},
    // ---- the log
    Variable{"SAPIENS_SEG_LOG",
             "The log level: `debug`, `info`, `warn`, `error` or `quiet`; `set_log_level()` (C++, "
             "Python) and the CLI's `-v` and `-q` override it",
             "`warn` (also for any other value)", "each log line, until `set_log_level()`"},
    // ---- the CPU
    Variable{"SAPIENS_SEG_CPU_GEMM",
             "Forces the library of the portable mode's float32 GEMMs on the CPU: `mkl`, `split`, "
             "`onednn` or `auto` (another value is an `invalid_input` error)",
             "`auto`: chosen per CPU (docs/cpu.md)", kEachCall},
    Variable{"SAPIENS_SEG_CPU_HEAD",
             "Forces the CPU decoder head's path: `gemm`, `onednn` or `mixed` (the sub-pixel "
             "GEMMs on the wide layers, oneDNN on the narrow ones; another value is an "
             "`invalid_input` error)",
             "chosen per CPU and dtype (docs/cpu.md)", kEachCall},
    Variable{"SAPIENS_SEG_CPU_WINOGRAD",
             "The CPU decoder head's float32 transposed convolutions by Winograd F(2x2, 2x2): "
             "`on` the wide ones (at least 128 channels in and out) on any CPU, `all` every one, "
             "`off` none, `auto` the CPU's rule (another value is an `invalid_input` error)",
             "`auto`: the wide float32 layers, except on AMD CPUs with AVX-512 (docs/cpu.md)",
             kEachCall},
    Variable{"SAPIENS_SEG_CPU_ATTENTION",
             "`libtorch` runs LibTorch's attention on the CPU, `kernel` the library's widest "
             "kernel the CPU can run (its AMX-BF16 path on AMX CPUs at head dims that are a "
             "multiple of 32; other values are ignored)",
             "chosen per CPU and dtype (docs/cpu.md)", kEachCall},
    Variable{"SAPIENS_SEG_CPU_FUSE",
             "`off` runs Sapiens2's CPU blocks as the module's ops one by one instead of the "
             "fused passes, which give the same bits (for A/B timings); `on` or unset: fused "
             "(another value is an `invalid_input` error)",
             "`on`", kEachCall},
    Variable{"SAPIENS_SEG_CPU_MLP_COLUMNS",
             "Sapiens2's float32 CPU MLP: `off` computes w12 whole, a number N in chunks of N "
             "output columns (gate and multiplier) with the SwiGLU of each chunk pair, `auto` the "
             "CPU's rule; chunks are used only where the first call at a shape finds them "
             "bit-identical to the whole GEMM (another value is an `invalid_input` error)",
             "`auto`: chunks of 1024, except on AMD CPUs with AVX-512 (whole there; docs/cpu.md)",
             kEachCall},
    Variable{"SAPIENS_SEG_CPU_FLAGS",
             "Replaces the CPU's `/proc/cpuinfo` flags (comma- or space-separated) in the dtype "
             "rules, to check them for another machine; the library's vector code still follows "
             "CPUID",
             "this CPU's flags", kOnce},
    Variable{"SAPIENS_SEG_CPU_VENDOR",
             "Replaces the CPU's `vendor_id` (`GenuineIntel`, `AuthenticAMD`) in the same rules",
             "this CPU's vendor", kOnce},
    Variable{"ONEDNN_MAX_CPU_ISA",
             "oneDNN's instruction-set cap, which oneDNN reads too: the dtype rules and `info` "
             "take it into account",
             "no cap", kOnce},
    Variable{"DNNL_MAX_CPU_ISA", "The older name of `ONEDNN_MAX_CPU_ISA`, read when that is unset",
             "no cap", kOnce},
    Variable{"OPENCV_IPP",
             "The opencv-python wheel's IPP switch (`disabled`, `sse42`, `avx2`, `avx512`): which "
             "of the wheel's code paths the Sapiens2 cubic resize reproduces",
             "the path the wheel takes on this CPU", kOnce},
};

}  // namespace

std::vector<EnvironmentVariable> environment_variables() {
  std::vector<EnvironmentVariable> out;
  out.reserve(kVariables.size());
  for (const Variable& v : kVariables) {
    out.push_back({std::string(v.name), std::string(v.meaning), std::string(v.default_value),
                   std::string(v.read)});
  }
  return out;
}

namespace {

constexpr std::array<std::pair<LogLevel, std::string_view>, 5> kLogLevels{{
    {LogLevel::kDebug, "debug"},
    {LogLevel::kInfo, "info"},
    {LogLevel::kWarn, "warn"},
    {LogLevel::kError, "error"},
    {LogLevel::kQuiet, "quiet"},
}};

}  // namespace

std::string_view to_string(LogLevel level) noexcept {
  for (const auto& [l, name] : kLogLevels) {
    if (l == level) return name;
  }
  return "unknown";
}

LogLevel parse_log_level(std::string_view name) {
  for (const auto& [l, n] : kLogLevels) {
    if (n == name) return l;
  }
  throw Error(ErrorCode::kInvalidInput, "log level '" + std::string(name) +
                                            "' is not one of debug, info, warn, error, quiet");
}

namespace core {
namespace {

// The environment as it is at construction: every variable of the table, read once.
class Environment {
 public:
  Environment() {
    for (std::size_t i = 0; i < kVariables.size(); ++i) {
      // The one getenv of the library. getenv's string is copied at once: a later setenv may
      // free it.
      if (const char* v = std::getenv(std::string(kVariables[i].name).c_str())) values_[i] = v;
    }
  }

  // The value, or nullopt when unset. A name outside the table is a bug here, reported by the
  // first call (every test that reads the settings).
  const std::optional<std::string>& get(std::string_view name) const {
    for (std::size_t i = 0; i < kVariables.size(); ++i) {
      if (kVariables[i].name == name) return values_[i];
    }
    throw Error(ErrorCode::kInternal,
                "settings: " + std::string(name) + " is not in the table of variables");
  }
  std::string text(std::string_view name) const { return get(name).value_or(std::string()); }
  // "1", "true", "yes" or "on", in any case.
  bool flag(std::string_view name) const {
    std::string v = text(name);
    std::transform(v.begin(), v.end(), v.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return v == "1" || v == "true" || v == "yes" || v == "on";
  }

 private:
  std::array<std::optional<std::string>, kVariables.size()> values_;
};

std::vector<std::filesystem::path> split_paths(const std::string& list) {
  std::vector<std::filesystem::path> out;
  std::stringstream ss(list);
  for (std::string d; std::getline(ss, d, ':');) {
    if (!d.empty()) out.emplace_back(d);
  }
  return out;
}

// SAPIENS_SEG_LOG's rule: the five names; anything else (unset, "WARN", "verbose") is warn.
LogLevel log_level_from(const std::string& text) {
  for (const auto& [l, n] : kLogLevels) {
    if (n == text) return l;
  }
  return LogLevel::kWarn;
}

}  // namespace

long WholeNumber::value() const {
  if (text.empty()) return fallback;
  std::size_t used = 0;
  long n = 0;
  try {
    n = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  // "5x" or "-1" must not be read as 5, or ignored, without a word.
  if (used == 0 || used != text.size() || n < lo || n > hi) {
    throw Error(ErrorCode::kInvalidInput, std::string(name) + "='" + text +
                                              "' is not a whole number from " + std::to_string(lo) +
                                              " to " + std::to_string(hi));
  }
  return n;
}

Settings read_settings() {
  const Environment env;
  Settings s;
  s.card_dirs = split_paths(env.text("SAPIENS_SEG_CARDS"));
  s.weights_path = env.text("SAPIENS_SEG_WEIGHTS_PATH");
  s.cache_home = env.text("SAPIENS_SEG_HOME");
  s.xdg_cache_home = env.text("XDG_CACHE_HOME");
  s.home = env.text("HOME");
  s.hf_hub_cache = env.text("HF_HUB_CACHE");
  s.hf_home = env.text("HF_HOME");
  s.accept_noncommercial = env.flag("SAPIENS_SEG_NONCOMMERCIAL");
  s.allow_unverified = env.flag("SAPIENS_SEG_ALLOW_UNVERIFIED");

  s.offline = env.flag("SAPIENS_SEG_OFFLINE");
  s.hf_hub_offline = env.flag("HF_HUB_OFFLINE");
  s.hf_endpoint = env.text("HF_ENDPOINT");
  s.hf_token = env.text("HF_TOKEN");
  s.use_hf_token = env.flag("SAPIENS_SEG_USE_HF_TOKEN");
  s.download_retries.text = env.text("SAPIENS_SEG_DOWNLOAD_RETRIES");
  s.retry_base_ms.text = env.text("SAPIENS_SEG_RETRY_BASE_MS");
  s.low_speed_time.text = env.text("SAPIENS_SEG_LOW_SPEED_TIME");

  s.log_level = log_level_from(env.text("SAPIENS_SEG_LOG"));

  s.cpu_gemm = env.text("SAPIENS_SEG_CPU_GEMM");
  s.cpu_head = env.text("SAPIENS_SEG_CPU_HEAD");
  s.cpu_winograd = env.text("SAPIENS_SEG_CPU_WINOGRAD");
  s.cpu_attention = env.text("SAPIENS_SEG_CPU_ATTENTION");
  s.cpu_fuse = env.text("SAPIENS_SEG_CPU_FUSE");
  s.cpu_mlp_columns = env.text("SAPIENS_SEG_CPU_MLP_COLUMNS");
  s.cpu_flags = env.get("SAPIENS_SEG_CPU_FLAGS");
  s.cpu_vendor = env.get("SAPIENS_SEG_CPU_VENDOR");
  s.onednn_max_cpu_isa = env.text("ONEDNN_MAX_CPU_ISA");
  s.dnnl_max_cpu_isa = env.text("DNNL_MAX_CPU_ISA");
  s.opencv_ipp = env.text("OPENCV_IPP");
  return s;
}

}  // namespace core
}  // namespace sapiens_seg
