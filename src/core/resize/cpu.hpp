// What the CPU running the resizes can do, read once through CPUID: the wheel's IPP code path
// depends on it (wheel_cubic.hpp), and so does which of the host loops' instruction sets runs.
//
// The library is compiled for baseline x86-64 (SSE2) and must run anywhere, so wider code is
// compiled per function (SAPIENS_SEG_AVX2 below) and only called after host_simd() said the CPU
// and the OS support it. Every vector loop has a portable twin with the same arithmetic (the
// vector code changes how many values one instruction computes, never how a value is computed),
// so the bytes do not depend on the path taken; resize_u8_simd (resize_host.hpp) lets tests
// compare the two on one machine.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#define SAPIENS_SEG_X86 1
// AVX2 (with FMA, which every AVX2 CPU has: Haswell, Zen and later) for one function.
#define SAPIENS_SEG_AVX2 __attribute__((target("avx2,fma")))
#else
#define SAPIENS_SEG_AVX2
#endif
#define SAPIENS_SEG_INLINE inline __attribute__((always_inline))

namespace sapiens_seg::core::resize_detail {

struct CpuFeatures {
  bool sse42 = false, avx = false, osxsave = false, fma = false;
  bool avx2 = false, bmi1 = false, bmi2 = false;
  bool avx512f = false, avx512cd = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512_vpopcntdq = false;
  bool avx10_512 = false;  // AVX10 version >= 2 with 512-bit vectors
  std::uint64_t xcr0 = 0;  // XGETBV(0) when osxsave
};
CpuFeatures cpu_features();  // this CPU (all false off x86)

// The instruction sets the host loops are written for.
enum class Simd {
  kPortable,  // plain C++ (what the compiler makes of it for the build's baseline)
  kAvx2,      // AVX2 and FMA, with the OS saving the YMM state
};
Simd simd_for(const CpuFeatures& cpu);
Simd host_simd();  // this CPU's, read once
const char* to_string(Simd simd);

}  // namespace sapiens_seg::core::resize_detail
