// Row chunks of the token-wise passes the CPU networks run a chunk at a time (the MLPs in
// bfloat16 and float16): chunks of `rows` rows, the last one taking in a remainder shorter than
// a quarter chunk instead of leaving it a chunk of its own. A thin last chunk costs nearly a whole
// chunk's time: each of its GEMMs streams the layer's whole weight for a handful of rows
// (Sapiens2 0.4b at 1024x768 has 3081 tokens, 3 x 1024 + 9: its 9-row w12 and w3 took 1.46 and
// 0.58 ms a block in bfloat16 on an AMX Xeon, 2026-12-07,
// benchmarks/results/intel-xeon-amx/cpu-profile-s2_full_0.4b-amx-gemm-shapes.json). With the 9
// rows taken in, mlp_bench's bfloat16 MLP ran 1.03x (0.4b) and 1.05x (1b) as fast on that machine
// (cpu-mlp-rows-amx.json), and its output had the whole-map GEMMs' bits, which the 9-row chunk's
// did not at 0.4b (oneDNN's kernel for a few rows sums in another order).
//
// Both the fused passes and the module's ops one by one (SAPIENS_SEG_CPU_FUSE=off) chunk by this
// plan, so they stay bit-identical to each other whatever the BLAS does with a chunk.
#pragma once

#include <algorithm>
#include <cstdint>

namespace sapiens_seg::core::cpu {

// The size of the chunk that starts at row `r` of `total`.
constexpr int64_t chunk_rows_at(int64_t r, int64_t total, int64_t rows) {
  const int64_t left = total - r;
  return left < rows + rows / 4 ? left : rows;
}

// The largest chunk of a pass over `total` rows: what its buffers are sized for.
constexpr int64_t largest_chunk_rows(int64_t total, int64_t rows) {
  int64_t largest = 0;
  for (int64_t r = 0; r < total; r += chunk_rows_at(r, total, rows)) {
    largest = std::max(largest, chunk_rows_at(r, total, rows));
  }
  return largest;
}

}  // namespace sapiens_seg::core::cpu
