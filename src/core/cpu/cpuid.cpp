#include "cpuid.hpp"

#include <string>

#include "sapiens_seg/error.hpp"

#ifdef SAPIENS_SEG_X86
#include <cpuid.h>
#endif

namespace sapiens_seg::core {

CpuFeatures cpu_features() {
  CpuFeatures f;
#ifdef SAPIENS_SEG_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  const unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 1) return f;
  __cpuid_count(0, 0, a, b, c, d);  // the vendor string, in EBX, EDX, ECX order
  f.amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;  // "Auth" "enti" "cAMD"
  __cpuid_count(1, 0, a, b, c, d);
  const int base_family = static_cast<int>((a >> 8) & 0xF);
  const int base_model = static_cast<int>((a >> 4) & 0xF);
  f.stepping = static_cast<int>(a & 0xF);
  f.family = base_family == 0xF ? base_family + static_cast<int>((a >> 20) & 0xFF) : base_family;
  f.model = base_family == 0x6 || base_family == 0xF
                ? (static_cast<int>((a >> 16) & 0xF) << 4) + base_model
                : base_model;
  f.sse42 = (c >> 20) & 1;
  f.fma = (c >> 12) & 1;
  f.osxsave = (c >> 27) & 1;
  f.avx = (c >> 28) & 1;
  f.f16c = (c >> 29) & 1;
  if (f.osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    f.xcr0 = (static_cast<std::uint64_t>(hi) << 32) | lo;
  }
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.bmi1 = (b >> 3) & 1;
    f.avx2 = (b >> 5) & 1;
    f.bmi2 = (b >> 8) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512cd = (b >> 28) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.avx512_vpopcntdq = (c >> 14) & 1;
    f.amx_bf16 = (d >> 22) & 1;
    f.amx_tile = (d >> 24) & 1;
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = (a >> 5) & 1;
    if ((d >> 19) & 1 && max_leaf >= 0x24) {  // AVX10: its version and vector widths
      unsigned a2 = 0, b2 = 0, c2 = 0, d2 = 0;
      __cpuid_count(0x24, 0, a2, b2, c2, d2);
      f.avx10_512 = (b2 & 0xFF) >= 2 && ((b2 >> 18) & 1);
    }
  }
#endif
  return f;
}

const CpuFeatures& host_cpu_features() {
  static const CpuFeatures f = cpu_features();
  return f;
}

const char* to_string(VecIsa isa) {
  switch (isa) {
    case VecIsa::kScalar:
      return "scalar";
    case VecIsa::kAvx2:
      return "avx2";
    case VecIsa::kAvx512:
      return "avx512";
    default:
      return "auto";
  }
}

bool vec_isa_runs(VecIsa isa) {
  const CpuFeatures& f = host_cpu_features();
  switch (isa) {
    case VecIsa::kAvx512:
      return f.avx512_core();
    case VecIsa::kAvx2:
      return f.avx2_fma_f16c();
    default:
      return true;
  }
}

VecIsa resolve_vec_isa(VecIsa isa) {
  if (isa == VecIsa::kAuto) {
    for (const VecIsa i : {VecIsa::kAvx512, VecIsa::kAvx2}) {
      if (vec_isa_runs(i)) return i;
    }
    return VecIsa::kScalar;
  }
  if (!vec_isa_runs(isa)) {
    throw Error(ErrorCode::kInvalidInput,
                std::string("the library's ") + to_string(isa) + " loops cannot run on this CPU");
  }
  return isa;
}

}  // namespace sapiens_seg::core
