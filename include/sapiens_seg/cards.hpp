// Model cards: one JSON file per checkpoint (cards/*.json), describing where it comes from, its
// full SHA-256, its licence, labels and preprocessing. Extra folders are read from the
// SAPIENS_SEG_CARDS environment variable (':'-separated); a card there overrides a bundled card
// with the same id.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sapiens_seg/export.hpp"

namespace sapiens_seg {

struct Card {
  std::string id;
  std::string family;  // "sapiens-v1" or "sapiens2"
  std::string description;
  std::string repo, revision, url;  // empty when unknown
  std::string file;                 // file name of the checkpoint
  std::string path_in_repo;         // its path inside the repo (default: file)
  std::optional<std::uint64_t> size;
  std::optional<std::string> sha256;  // full lower-case hex; nullopt when no pinned hash exists
  std::string license_id, license_url;
  bool commercial_use = false;
  // Use restrictions that bind every user (Sapiens2: section 1.b.vi); shown once per machine.
  std::string license_notice;
  std::string format;  // "torchscript" or "safetensors"
  int input_height = 0, input_width = 0;
  // How the demo resizes to the input size: "linear" (v1) or "area_or_cubic" (Sapiens2:
  // INTER_AREA when the width shrinks, else INTER_CUBIC).
  std::string resize = "linear";
  std::array<float, 3> mean{}, std{};              // demo (default) normalisation, RGB
  std::array<float, 3> mean_train{}, std_train{};  // training normalisation, RGB
  int patch = 0, embed_dim = 0, depth = 0, heads = 0, mlp = 0, head_channels = 0, num_classes = 0;
  int kv_heads = 0;  // Sapiens2: key/value heads of the grouped-query blocks (0: none given)
  std::string label_set;
  std::vector<std::string> classes;
  std::vector<std::array<std::uint8_t, 3>> palette;
  std::string source;  // the card file it was read from
};

// Every card visible now (bundled + SAPIENS_SEG_CARDS), sorted by id. Card files that cannot be
// read are skipped, with one warning each on stderr (see broken_cards).
SAPIENS_SEG_API std::vector<Card> list_cards();
// The card files list_cards skipped, with why.
struct BrokenCard {
  std::string path;
  std::string error;  // the message naming the file and the field
};
SAPIENS_SEG_API std::vector<BrokenCard> broken_cards();
// The card for `id` (a trailing "@revision" must match the card's revision). Throws
// Error(kNotFound) listing the known ids.
SAPIENS_SEG_API Card find_card(const std::string& id);
// The licence gate every load passes: returns when the card allows commercial use, when
// `accept_noncommercial` is set, or when SAPIENS_SEG_NONCOMMERCIAL is true (1, true, yes, on);
// else throws Error(kLicenseNotAccepted) saying how to accept it. For front ends that check
// before they start work (a batch job's driver), so that they apply the library's rule, not a
// copy of it.
SAPIENS_SEG_API void check_license(const Card& card, bool accept_noncommercial);
// Parse one card file. Throws Error(kFormatError) naming the file and the field.
SAPIENS_SEG_API Card read_card(const std::string& path);

struct SystemInfo {
  std::string version, torch_version, opencv_version, openssl_version;
  int threads = 0;
  bool cuda_available = false;
  int cuda_devices = 0;
  bool kernels_compiled = false;
  std::vector<std::string> backends;  // modes that can run on this machine, with why not
  std::string cpu_model;              // "model name" of /proc/cpuinfo
  // "AuthenticAMD family 25 model 1 stepping 1" (CPUID): tells apart generations of one name.
  std::string cpu_id;
  std::vector<std::string> cpu_flags;   // the ISA flags that decide the CPU dtypes (avx2, ...)
  std::string onednn_cap;               // ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA when set
  std::vector<std::string> cpu_dtypes;  // "bfloat16: no: ..." per dtype, with the reason
  // Per dtype, which attention the portable mode runs on the CPU ("float32: the library's
  // AVX-512 kernel", or LibTorch's with what the kernel needs), from the CPU's CPUID.
  std::vector<std::string> cpu_attention;
  // Which library runs the portable mode's float32 GEMMs on this CPU, and why ("float32 GEMMs:
  // oneDNN (AMD Zen 5 or later ...)"); SAPIENS_SEG_CPU_GEMM overrides it.
  std::string cpu_gemm;
  // Which code path of the opencv-python wheel's INTER_CUBIC (Intel IPP's) this CPU takes, and
  // so whose bytes the Sapiens2 resize reproduces here: "ipp-k0-icx", "ipp-k0-skx", "ipp-l9",
  // "ipp-y8" or "opencv" (no IPP).
  std::string wheel_cubic_path;
  std::vector<std::string> card_dirs;
};
SAPIENS_SEG_API SystemInfo system_info();

}  // namespace sapiens_seg
