#include "cpu.hpp"

#ifdef SAPIENS_SEG_X86
#include <cpuid.h>
#endif

namespace sapiens_seg::core::resize_detail {

CpuFeatures cpu_features() {
  CpuFeatures f;
#ifdef SAPIENS_SEG_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  const unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 1) return f;
  __cpuid_count(1, 0, a, b, c, d);
  f.sse42 = (c >> 20) & 1;
  f.fma = (c >> 12) & 1;
  f.osxsave = (c >> 27) & 1;
  f.avx = (c >> 28) & 1;
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
    __cpuid_count(7, 1, a, b, c, d);
    if ((d >> 19) & 1 && max_leaf >= 0x24) {  // AVX10: its version and vector widths
      __cpuid_count(0x24, 0, a, b, c, d);
      f.avx10_512 = (b & 0xFF) >= 2 && ((b >> 18) & 1);
    }
  }
#endif
  return f;
}

Simd simd_for(const CpuFeatures& cpu) {
#ifdef SAPIENS_SEG_X86
  // The OS must save the SSE and AVX (YMM) state across context switches, or AVX faults.
  const bool ymm_os = cpu.osxsave && cpu.avx && (cpu.xcr0 & 0x6) == 0x6;
  if (ymm_os && cpu.avx2 && cpu.fma) return Simd::kAvx2;
#else
  (void)cpu;
#endif
  return Simd::kPortable;
}

Simd host_simd() {
  static const Simd simd = simd_for(cpu_features());
  return simd;
}

const char* to_string(Simd simd) {
  return simd == Simd::kAvx2 ? "avx2" : "portable";
}

}  // namespace sapiens_seg::core::resize_detail
