#include "cpuinfo.hpp"

#include <ATen/Context.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <utility>

#include "../settings.hpp"

namespace sapiens_seg::core {

namespace {

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::set<std::string> split_flags(const std::string& text) {
  std::string t = text;
  std::replace(t.begin(), t.end(), ',', ' ');
  std::istringstream in(t);
  return {std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
}

void set_flags(CpuCaps& c, const std::set<std::string>& f) {
  auto has = [&](const char* name) { return f.count(name) > 0; };
  c.avx2 = has("avx2");
  c.fma = has("fma");
  c.f16c = has("f16c");
  c.avx512f = has("avx512f");
  c.avx512bw = has("avx512bw");
  c.avx512vl = has("avx512vl");
  c.avx512dq = has("avx512dq");
  c.avx512_bf16 = has("avx512_bf16");
  c.avx512_fp16 = has("avx512_fp16");
  c.amx_tile = has("amx_tile");
  c.amx_bf16 = has("amx_bf16");
  c.amx_fp16 = has("amx_fp16");
}

const char* isa_name(OnednnIsa isa) {
  switch (isa) {
    case OnednnIsa::kSse41:
      return "SSE41";
    case OnednnIsa::kAvx:
      return "AVX";
    case OnednnIsa::kAvx2:
      return "AVX2";
    case OnednnIsa::kAvx2Vnni:
      return "AVX2_VNNI";
    case OnednnIsa::kAvx2Vnni2:
      return "AVX2_VNNI_2";
    case OnednnIsa::kAvx512Core:
      return "AVX512_CORE";
    case OnednnIsa::kAvx512CoreVnni:
      return "AVX512_CORE_VNNI";
    case OnednnIsa::kAvx512CoreBf16:
      return "AVX512_CORE_BF16";
    case OnednnIsa::kAvx512CoreFp16:
      return "AVX512_CORE_FP16";
    case OnednnIsa::kAvx512CoreAmx:
      return "AVX512_CORE_AMX";
    case OnednnIsa::kAvx512CoreAmxFp16:
      return "AVX512_CORE_AMX_FP16";
    case OnednnIsa::kAll:
      return "ALL";
  }
  return "ALL";
}

// What the CPU has, for messages: the widest vector level and the reduced-precision extensions.
std::string has_text(const CpuCaps& c) {
  std::vector<std::string> have;
  if (c.avx512_core()) {
    have.emplace_back("AVX512 (F, BW, VL, DQ)");
  } else if (c.avx512f) {
    have.emplace_back("AVX512F without the AVX512-core subset");
  } else if (c.avx2) {
    have.emplace_back(c.fma ? "AVX2 and FMA, no AVX512" : "AVX2, no AVX512");
  } else {
    have.emplace_back("neither AVX2 nor AVX512");
  }
  if (c.avx512_bf16) have.emplace_back("AVX512-BF16");
  if (c.avx512_fp16) have.emplace_back("AVX512-FP16");
  if (c.amx_bf16) have.emplace_back("AMX-BF16");
  if (c.amx_fp16) have.emplace_back("AMX-FP16");
  std::string out;
  for (const auto& h : have) out += (out.empty() ? "" : ", ") + h;
  return out;
}

// The native reduced-precision instructions present, e.g. "AVX512-BF16 and AMX-BF16".
std::string native_text(const CpuCaps& c, bool bf16) {
  const bool vec = bf16 ? c.avx512_bf16 : c.avx512_fp16;
  const bool amx = c.amx_tile && (bf16 ? c.amx_bf16 : c.amx_fp16);
  const std::string v = bf16 ? "AVX512-BF16" : "AVX512-FP16", a = bf16 ? "AMX-BF16" : "AMX-FP16";
  return vec && amx ? v + " and " + a : vec ? v : a;
}

std::string cap_text(const CpuCaps& c) {
  return c.onednn_cap_text.empty() ? std::string(isa_name(c.onednn_cap)) : c.onednn_cap_text;
}

}  // namespace

std::vector<std::string> CpuCaps::flags() const {
  const std::pair<const char*, bool> all[] = {
      {"avx2", avx2},
      {"fma", fma},
      {"f16c", f16c},
      {"avx512f", avx512f},
      {"avx512bw", avx512bw},
      {"avx512vl", avx512vl},
      {"avx512dq", avx512dq},
      {"avx512_bf16", avx512_bf16},
      {"avx512_fp16", avx512_fp16},
      {"amx_tile", amx_tile},
      {"amx_bf16", amx_bf16},
      {"amx_fp16", amx_fp16},
  };
  std::vector<std::string> out;
  for (const auto& [name, on] : all) {
    if (on) out.emplace_back(name);
  }
  return out;
}

OnednnIsa parse_onednn_isa(const std::string& value) {
  const std::string v = upper(trim(value));
  static const std::pair<const char*, OnednnIsa> names[] = {
      {"SSE41", OnednnIsa::kSse41},
      {"AVX", OnednnIsa::kAvx},
      {"AVX2", OnednnIsa::kAvx2},
      {"AVX2_VNNI", OnednnIsa::kAvx2Vnni},
      {"AVX2_VNNI_2", OnednnIsa::kAvx2Vnni2},
      {"AVX512_CORE", OnednnIsa::kAvx512Core},
      {"AVX512_CORE_VNNI", OnednnIsa::kAvx512CoreVnni},
      {"AVX512_CORE_BF16", OnednnIsa::kAvx512CoreBf16},
      {"AVX512_CORE_FP16", OnednnIsa::kAvx512CoreFp16},
      {"AVX10_1_512", OnednnIsa::kAvx512CoreFp16},
      {"AVX512_CORE_AMX", OnednnIsa::kAvx512CoreAmx},
      {"AVX10_1_512_AMX", OnednnIsa::kAvx512CoreAmx},
      {"AVX512_CORE_AMX_FP16", OnednnIsa::kAvx512CoreAmxFp16},
      {"AVX10_1_512_AMX_FP16", OnednnIsa::kAvx512CoreAmxFp16},
  };
  for (const auto& [name, isa] : names) {
    if (v == name) return isa;
  }
  return OnednnIsa::kAll;  // ALL, DEFAULT, newer levels, or unset
}

CpuCaps parse_cpuinfo(const std::string& text) {
  CpuCaps c;
  c.model = "unknown";
  std::istringstream in(text);
  bool have_model = false, have_flags = false;
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    if (key == "vendor_id" && c.vendor.empty()) {
      c.vendor = trim(line.substr(colon + 1));
    } else if (key == "model name" && !have_model) {
      c.model = trim(line.substr(colon + 1));
      have_model = true;
    } else if (key == "flags" && !have_flags) {
      set_flags(c, split_flags(line.substr(colon + 1)));
      have_flags = true;
    }
  }
  return c;
}

const CpuCaps& cpu_caps() {
  static const CpuCaps caps = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CpuCaps c = parse_cpuinfo(text);
    const Settings env = read_settings();
    if (env.cpu_flags) set_flags(c, split_flags(*env.cpu_flags));
    if (env.cpu_vendor) c.vendor = trim(*env.cpu_vendor);
    // oneDNN reads ONEDNN_MAX_CPU_ISA first, then the older name.
    const bool onednn = !env.onednn_max_cpu_isa.empty();
    if (onednn || !env.dnnl_max_cpu_isa.empty()) {
      const std::string& v = onednn ? env.onednn_max_cpu_isa : env.dnnl_max_cpu_isa;
      c.onednn_cap = parse_onednn_isa(v);
      c.onednn_cap_text = (onednn ? "ONEDNN_MAX_CPU_ISA=" : "DNNL_MAX_CPU_ISA=") + v;
    }
    c.mkldnn_enabled = at::hasMKLDNN() && at::globalContext().userEnabledMkldnn();
    return c;
  }();
  return caps;
}

std::string cpu_dtype_unavailable_reason(const CpuCaps& c, at::ScalarType dtype) {
  if (dtype == at::kFloat) return "";
  if (dtype != at::kBFloat16 && dtype != at::kHalf) {
    return std::string(c10::toString(dtype)) + " is not a compute dtype of the portable network";
  }
  const bool bf16 = dtype == at::kBFloat16;
  const std::string name = bf16 ? "bfloat16" : "float16";
  const std::string needs = bf16 ? "AVX512-BF16 or AMX-BF16" : "AVX512-FP16 or AMX-FP16";
  const std::string tail = "; use float32 (the default)";
  if (!c.mkldnn_enabled) {
    return name + " needs LibTorch's oneDNN GEMMs, which are disabled or not built in here" + tail;
  }
  const bool native = bf16 ? c.avx512_core() && (c.avx512_bf16 || (c.amx_tile && c.amx_bf16))
                           : c.avx512_core() && (c.avx512_fp16 || (c.amx_tile && c.amx_fp16));
  if (!native) {
    return name + " runs fast on the CPU only with native " + name + " dot products (" + needs +
           "); this CPU (" + c.model + ") has " + has_text(c) + ", so LibTorch's " + name +
           " GEMMs would run a scalar or emulated fallback, many times slower than float32" + tail;
  }
  // Measured (benchmarks/cpu_dtype_probe.py, F.linear at 3072 x 1024 x 1024): bfloat16 0.60x
  // float32 on an Intel Xeon with AVX512-BF16 whose AMX the hypervisor hides, 2.90x on AMD Zen 4.
  // The likely why: Intel cores issue VDPBF16PS on one port and float32 FMAs on two (no more
  // multiply-adds per cycle), and oneDNN's bfloat16 GEMM also converts its operands; Zen 4
  // double-pumps its 512-bit float32 FMAs. So without AMX-BF16 only AMD's AVX512-BF16 counts; an
  // unknown vendor is not assumed to be AMD.
  const bool amx_bf16 = c.amx_tile && c.amx_bf16;
  if (bf16 && !amx_bf16 && !c.amd()) {
    return "bfloat16 would run slower than float32 on this CPU (" + c.model +
           "): it has AVX512-BF16 but not AMX-BF16, and on " +
           (c.vendor.empty() ? std::string("a CPU of unknown vendor") : c.vendor + " cores") +
           " those dot products are no faster than float32's FMAs (LibTorch's bfloat16 GEMMs "
           "measured 0.6x float32's on such a CPU)" +
           tail;
  }
  // float16 with AVX512-FP16 alone, on the same Xeon: LibTorch's float16 linear 1.03x float32
  // (oneDNN accumulates in float32, so the half-width vectors buy nothing) and a whole v1 0.3b
  // call 0.84x float32's (24.3 against 20.4 s, one process, alternating calls): a lower
  // precision for no speed. Only AMX-FP16 makes float16 pay.
  if (!bf16 && !(c.amx_tile && c.amx_fp16)) {
    return "float16 would run slower than float32 on this CPU (" + c.model +
           "): it has AVX512-FP16 but not AMX-FP16, and there LibTorch's float16 GEMMs are no "
           "faster than float32's (measured 1.03x, and a whole call 0.84x, on such a CPU)" +
           tail;
  }
  // The instructions are there; oneDNN must also be allowed to use them (for bfloat16 on Intel
  // and for float16, the AMX ones).
  const bool vec = bf16 && c.avx512_bf16 && c.amd();
  const OnednnIsa need = bf16 ? (vec ? OnednnIsa::kAvx512CoreBf16 : OnednnIsa::kAvx512CoreAmx)
                              : OnednnIsa::kAvx512CoreAmxFp16;
  if (c.onednn_cap < need) {
    return name + ": this CPU has " + native_text(c, bf16) + " but oneDNN is capped below it (" +
           cap_text(c) + "; it needs " + isa_name(need) + " or higher), so " + name +
           " GEMMs would run a fallback many times slower than float32" + tail +
           ", or lift the cap";
  }
  return "";
}

std::vector<std::string> cpu_dtype_lines(const CpuCaps& c) {
  std::vector<std::string> out;
  out.emplace_back("float32: yes (" + has_text(c) + ")");
  for (const bool bf16 : {true, false}) {
    const std::string why = cpu_dtype_unavailable_reason(c, bf16 ? at::kBFloat16 : at::kHalf);
    out.emplace_back(
        std::string(bf16 ? "bfloat16" : "float16") + ": " +
        (why.empty() ? "yes (" + native_text(c, bf16) + " GEMMs through oneDNN)" : "no: " + why));
  }
  return out;
}

}  // namespace sapiens_seg::core
