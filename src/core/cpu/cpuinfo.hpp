// What this CPU can do, and which compute dtypes the portable network may use on it.
//
// LibTorch runs reduced-precision GEMMs (linear, the attention kernel's blocks, the head's 1x1
// convolutions and deconvolutions) through oneDNN only where oneDNN has a bfloat16/float16 code
// path for the CPU; elsewhere it falls back to a scalar loop that is ~50x slower than its float32
// GEMM. Whether the fast path exists depends on the instructions (AVX512-BF16, AMX-BF16,
// AVX512-FP16, AMX-FP16) and on the ISA cap oneDNN honours (ONEDNN_MAX_CPU_ISA, or the older
// DNNL_MAX_CPU_ISA). The rule below is a table of those, not a timing probe at load: it gives the
// same answer on every load of the same machine, costs nothing, and names what is missing. The
// table's rows are backed by benchmarks/cpu_dtype_probe.py, which times each dtype's GEMM with
// oneDNN capped at each ISA level.
//
// Two probes of one CPU, on purpose (cpuid.hpp is the other), and not one: this one answers rules
// about what LibTorch's oneDNN will do, and such a rule must be checkable against another
// machine's flags, so SAPIENS_SEG_CPU_FLAGS / SAPIENS_SEG_CPU_VENDOR replace what it reads (the
// CLI's and the binding's tests of the dtype rule rely on that). cpuid.hpp gates the
// library's own vector code, which no variable may switch on for a CPU or OS that lacks it (the
// process would die on the first such instruction). One probe for both would either hand that
// gate to the environment or take the override from the rules; and the kernel's flag list is not
// always CPUID's (features the kernel disabled or cannot save state for are left out), so reading
// one source for both would change answers on such machines.
#pragma once

#include <ATen/core/ScalarType.h>

#include <string>
#include <vector>

namespace sapiens_seg::core {

// oneDNN's CPU ISA levels that matter here, in increasing order (a subset of dnnl::cpu_isa).
enum class OnednnIsa {
  kSse41,
  kAvx,
  kAvx2,
  kAvx2Vnni,
  kAvx2Vnni2,
  kAvx512Core,
  kAvx512CoreVnni,
  kAvx512CoreBf16,
  kAvx512CoreFp16,     // AVX10.1/512: AVX512-FP16 (Sapphire Rapids and newer)
  kAvx512CoreAmx,      // + AMX-BF16 / AMX-INT8
  kAvx512CoreAmxFp16,  // + AMX-FP16 (Granite Rapids)
  kAll,                // no cap
};

struct CpuCaps {
  std::string model;   // "model name" of /proc/cpuinfo ("unknown" where there is none)
  std::string vendor;  // "vendor_id" (GenuineIntel, AuthenticAMD; "" where there is none)
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_fp16 = false;
  OnednnIsa onednn_cap = OnednnIsa::kAll;  // from ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA
  std::string onednn_cap_text;             // the variable as set ("" when unset)
  bool mkldnn_enabled = true;              // LibTorch built with oneDNN and not disabled

  bool avx512_core() const { return avx512f && avx512bw && avx512vl && avx512dq; }
  bool amd() const { return vendor == "AuthenticAMD"; }
  // The flags above that are set, in /proc/cpuinfo spelling.
  std::vector<std::string> flags() const;
};

// The capabilities of this machine (read once; SAPIENS_SEG_CPU_FLAGS, a comma- or space-separated
// flag list in /proc/cpuinfo spelling, replaces the CPU's flags, and SAPIENS_SEG_CPU_VENDOR its
// vendor_id, for tests and for checking the rule against another machine).
const CpuCaps& cpu_caps();
// Parses a /proc/cpuinfo-style text (model name and flags lines), for cpu_caps and tests.
CpuCaps parse_cpuinfo(const std::string& text);
// Parses an oneDNN ISA cap value (case-insensitive: AVX2, AVX512_CORE_BF16, ALL, ...); kAll
// for an empty or unknown value (oneDNN itself ignores values it does not know).
OnednnIsa parse_onednn_isa(const std::string& value);

// Why the portable network cannot run `dtype` on this CPU at full speed, or "" when it can:
// float32 always; bfloat16 where oneDNN may use native bfloat16 dot products that outrun
// float32's FMAs: AMX-BF16, or AVX512-BF16 on AMD cores (on Intel cores without AMX, AVX512-BF16
// runs LibTorch's bfloat16 GEMMs slower than float32); float16 with AMX-FP16 (AVX512-FP16 alone
// runs it no faster than float32).
std::string cpu_dtype_unavailable_reason(const CpuCaps& caps, at::ScalarType dtype);

// One line per dtype for `info`: "float32: ..." with what it runs on or why it is refused.
std::vector<std::string> cpu_dtype_lines(const CpuCaps& caps);

}  // namespace sapiens_seg::core
