// What the CPU running the library can execute, read through CPUID and XGETBV: which of the
// library's own vector loops (the resizes' AVX2 code, the CPU attention kernel's AVX-512 code)
// may run. /proc/cpuinfo (cpuinfo.hpp) answers a different question, what LibTorch's oneDNN will
// do, and can be overridden for tests; this cannot, because running an instruction the CPU lacks
// kills the process.
//
// The library is compiled for baseline x86-64 (SSE2) and must run anywhere, so wider code is
// compiled per function (__attribute__((target(...)))) and only called after these bits, and the
// OS's saved register state in XCR0, said it may.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#define SAPIENS_SEG_X86 1
#endif

namespace sapiens_seg::core {

struct CpuFeatures {
  bool sse42 = false, avx = false, osxsave = false, fma = false, f16c = false;
  bool avx2 = false, bmi1 = false, bmi2 = false;
  bool avx512f = false, avx512cd = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512_vpopcntdq = false;
  bool avx512_bf16 = false;                 // VDPBF16PS / VCVTNEPS2BF16
  bool avx10_512 = false;                   // AVX10 version >= 2 with 512-bit vectors
  bool amx_tile = false, amx_bf16 = false;  // AMX tiles and their bfloat16 products
  std::uint64_t xcr0 = 0;                   // XGETBV(0) when osxsave
  bool amd = false;  // vendor "AuthenticAMD" (leaf 0): which of the kernels pay off
  // Leaf 1's signature with the extended fields folded in, as /proc/cpuinfo prints them (AMD Zen 3
  // and Zen 4 are family 0x19, Zen 5 0x1A; Intel's server cores family 6). It tells apart
  // generations that share their feature bits but not their vector units.
  int family = 0, model = 0, stepping = 0;

  // The OS saves the SSE and AVX (YMM) state across context switches (else AVX faults).
  bool ymm_os() const { return osxsave && avx && (xcr0 & 0x6) == 0x6; }
  // ... and the AVX-512 state (opmask, upper ZMM halves, ZMM16-31).
  bool zmm_os() const { return ymm_os() && (xcr0 & 0xE0) == 0xE0; }
  // AVX2 with FMA (Haswell, Zen 1 and later), usable: the resizes' and the attention's 8-wide code.
  bool avx2_fma() const { return ymm_os() && avx2 && fma; }
  // ... and F16C (float16 <-> float32 conversions; every AVX2 CPU so far has it).
  bool avx2_fma_f16c() const { return avx2_fma() && f16c; }
  // AVX-512 F/BW/DQ/VL with FMA (Skylake-X, Zen 4 and later), usable.
  bool avx512_core() const {
    return zmm_os() && fma && avx512f && avx512bw && avx512dq && avx512vl;
  }
  // AMX bfloat16 products, with the tile state saved by the OS (XTILECFG and XTILEDATA; Linux
  // also wants each process to ask for it, which oneDNN does before its first AMX kernel).
  bool amx_bf16_os() const { return amx_tile && amx_bf16 && (xcr0 & 0x60000) == 0x60000; }
};

CpuFeatures cpu_features();              // this CPU, read on every call (all false off x86)
const CpuFeatures& host_cpu_features();  // this CPU, read once

// The vector code of the library's elementwise loops (head/channel_ops, v2/cpu_ops; see
// cpu_vec.hpp). kAuto: the widest this CPU runs (AVX-512 F/BW/VL with FMA, else AVX2 with FMA and
// F16C, else scalar). The others are for tests and A/B benchmarks.
enum class VecIsa { kAuto, kScalar, kAvx2, kAvx512 };
const char* to_string(VecIsa isa);
bool vec_isa_runs(VecIsa isa);  // kAuto and kScalar always
// kAuto as the widest this CPU runs; another as itself, or Error(kInvalidInput) where it cannot
// run.
VecIsa resolve_vec_isa(VecIsa isa);

}  // namespace sapiens_seg::core
