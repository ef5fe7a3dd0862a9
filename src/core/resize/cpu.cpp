#include "cpu.hpp"

namespace sapiens_seg::core::resize_detail {

Simd simd_for(const CpuFeatures& cpu) {
#ifdef SAPIENS_SEG_X86
  if (cpu.avx2_fma()) return Simd::kAvx2;
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
