// Which instruction set the resizes' host loops run, from what the CPU can do (../cpu/cpuid.hpp):
// the wheel's IPP code path depends on it too (wheel_cubic.hpp).
//
// Wider code is compiled per function (SAPIENS_SEG_AVX2 below) and only called after host_simd()
// said the CPU and the OS support it. Every vector loop has a portable twin with the same
// arithmetic (the vector code changes how many values one instruction computes, never how a value
// is computed), so the bytes do not depend on the path taken; resize_u8_simd (resize_host.hpp) lets
// tests compare the two on one machine.
#pragma once

#include "../cpu/cpuid.hpp"

#ifdef SAPIENS_SEG_X86
// AVX2 (with FMA, which every AVX2 CPU has: Haswell, Zen and later) for one function.
#define SAPIENS_SEG_AVX2 __attribute__((target("avx2,fma")))
#else
#define SAPIENS_SEG_AVX2
#endif
#define SAPIENS_SEG_INLINE inline __attribute__((always_inline))

namespace sapiens_seg::core::resize_detail {

using core::cpu_features;
using core::CpuFeatures;

// The instruction sets the host loops are written for.
enum class Simd {
  kPortable,  // plain C++ (what the compiler makes of it for the build's baseline)
  kAvx2,      // AVX2 and FMA, with the OS saving the YMM state
};
Simd simd_for(const CpuFeatures& cpu);
Simd host_simd();  // this CPU's, read once
const char* to_string(Simd simd);

}  // namespace sapiens_seg::core::resize_detail
