#!/usr/bin/env bash
# The full-size CPU protocol of the peers comparison (ONNX Runtime, OpenVINO, transformers and
# the authors' pipeline beside this library), on a quiet machine. Writes the JSON results into
# benchmarks/results/$MACHINE/ (one folder per machine kind: amd-zen4, intel-xeon-amx, ...; see
# benchmarks/results/README.md) and regenerates docs/performance.md and the README's summary
# table. Steps can be run alone:
#
#   MACHINE=amd-zen4 benchmarks/run_cpu_peers.sh [all|setup|fixtures|probe|v1|v1-f32|s2-0.4b|
#                                                 s2-0.4b-f32|s2-1b|large|memory-5b|kernels|
#                                                 profiles|readme]...
#
# kernels runs the micro-benchmarks behind the CPU rules (attention_bench, head_bench, mlp_bench:
# the attention path, the Winograd head and Sapiens2's MLP column chunks per CPU; about 10 min);
# profiles, one profiled call per column of v1 0.3b and Sapiens2 0.4b float32 beside the peers,
# with every GEMM shape timed alone (profile_peers.py --gemm-shapes; about 15 min). Neither is in
# `all`: run them on a CPU kind whose rules are not yet measured (docs/cpu.md).
#
# v1-f32 and s2-0.4b-f32 are the protocol for CPUs where the library refuses bfloat16 (AVX2-only,
# Intel without AMX): float32 columns only; `all` runs v1 and s2-0.4b instead.
#
# Times on 2 cores (AVX512-BF16), measured 2026-12-01: fixtures and ONNX exports 30 min (1.4 +
# 1.6 + 5.9 GB), probe 1 min, v1 30 min and s2-0.4b 25 min with SIZES=1024x768 (about twice
# that at both sizes), memory-5b 1 h (a 20.4 GB file; delete it after). s2-1b took 36 min on a
# 2-core AMX Xeon (2026-12-03, 4096^3 float32 GEMM 424 GFLOP/s); more on the AMD machine above,
# whose GEMM ran at 185 (not measured there).
# Every speed_check run waits for a quiet machine before each timed call (--wait-quiet) and
# records the load it saw; every result file records the CPU model, ISA flags, cores, load and
# versions.
#
# Memory: speed_check keeps every column's model loaded at once (one process each). All seven
# v1 0.3b columns outgrow 24 GiB (the kernel killed a 6 GB peer worker on 2026-12-01), and at 1b
# (5.9 GB of float32) they would need ~40 GB, so every model runs in two runs that share the
# library's columns (ratios are taken within a run, never across runs).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
PY=${PY:-.venv/bin/python}
BUILD=${BUILD:-build-bench}
FIX=${FIX:-$BUILD/fixtures}
ONNX=${ONNX:-$BUILD/onnx}
# The machine's folder: named for the machine kind, never guessed here (a wrong guess would file
# one machine's figures under another's). RES overrides the whole path.
MACHINE=${MACHINE:-}
RES=${RES:-benchmarks/results/$MACHINE}
SC="$BUILD/bin/speed_check"
QUIET=${QUIET:-120}
COMMON=(--batch 1 --warmup 1 --rounds 3 --calls 1 --load-repeats 1 --wait-quiet "$QUIET")
# The sizes of the v1 and s2-0.4b runs; SIZES=1024x768 halves their time (the goals are stated
# at 1024x768; the larger size adds the resizes and the full-size upsample + argmax).
SIZES=${SIZES:-1024x768,3000x4000}
# Appended to the v1, s2-0.4b and s2-1b result names, to keep a second run on the same kind of
# machine beside the committed ones (TAG=-amx: cpu-peers-full_0.3b-amx-a.json; the f32 steps put
# it after the ISA, cpu-peers-full_0.3b-avx512bf16-xeon.json).
TAG=${TAG:-}

log() { printf '[run_cpu_peers] %s\n' "$*" >&2; }

need_res() {
  if [ -z "$MACHINE" ] && [ "$RES" = benchmarks/results/ ]; then
    echo "run_cpu_peers.sh: set MACHINE to this machine's folder under benchmarks/results/" \
      "(see benchmarks/results/README.md), or RES to a folder" >&2
    exit 2
  fi
  mkdir -p "$RES"
}

step_setup() {
  tools/setup.sh --bench
  cmake --preset release -B "$BUILD" -DSAPIENS_SEG_BUILD_BENCHMARKS=ON
  cmake --build "$BUILD" --target speed_check sapiens-seg -- -j"$(nproc)"
}

step_fixtures() {
  mkdir -p "$FIX" "$ONNX"
  [ -f "$FIX/full_0.3b_torchscript.pt2" ] ||
    "$PY" tests/fixtures/make_fixtures.py --out "$FIX" --only full_0.3b
  [ -f "$FIX/s2_full_0.4b.safetensors" ] ||
    "$PY" tests/fixtures/sapiens2.py --out "$FIX" --only s2_full_0.4b
  [ -f "$FIX/s2_full_1b.safetensors" ] ||
    "$PY" tests/fixtures/sapiens2.py --out "$FIX" --only s2_full_1b
  # One ONNX export per file, checked against the original (tools/export_onnx.py), reused by
  # every run below.
  for f in full_0.3b_torchscript.pt2 s2_full_0.4b.safetensors s2_full_1b.safetensors; do
    out="$ONNX/${f%.*}.onnx"
    [ -f "$out" ] || "$PY" tools/export_onnx.py --model "$FIX/$f" --out "$out"
  done
}

step_probe() {
  need_res
  # bf16/fp16 vs fp32 GEMM and attention with oneDNN capped at each ISA level: the CPU dtype
  # rule's measurements (src/core/cpu/cpuinfo.hpp).
  "$PY" benchmarks/cpu_dtype_probe.py --json "$RES/cpu-dtype-probe.json"
}

step_v1() {
  need_res
  # Two runs for memory (see above): the authors' pipeline and the original mode beside the
  # library, then the ONNX peers beside the library.
  "$SC" --model "$FIX/full_0.3b_torchscript.pt2" \
    --modes original-python,original,portable --dtype float32,bfloat16 \
    --sizes "$SIZES" "${COMMON[@]}" \
    --json "$RES/cpu-peers-full_0.3b$TAG-a.json"
  "$SC" --model "$FIX/full_0.3b_torchscript.pt2" --onnx "$ONNX/full_0.3b_torchscript.onnx" \
    --modes portable,onnxruntime,openvino --dtype float32,bfloat16 \
    --sizes "$SIZES" "${COMMON[@]}" \
    --json "$RES/cpu-peers-full_0.3b$TAG-b.json"
}

cpu_isa() {
  if grep -qw avx512_bf16 /proc/cpuinfo; then
    echo avx512bf16
  elif grep -qw avx512f /proc/cpuinfo; then
    echo avx512-nobf16
  elif grep -qw avx2 /proc/cpuinfo; then
    echo avx2
  else
    echo x86-64
  fi
}

# OpenVINO's columns of s2-0.4b-f32's second run: its f32, plus its default precision where that
# is not f32 (bf16 on CPUs with AVX512-BF16, whether or not the library allows it). v1-f32 keeps
# f32 alone: a fifth column there would not fit in 24 GiB beside the other four.
ov_modes() {
  if grep -qw avx512_bf16 /proc/cpuinfo; then echo openvino; else echo openvino-f32; fi
}

step_v1_f32() {
  need_res
  # CPUs where the library refuses bfloat16 (AVX2-only; Intel without AMX): float32 only, in one
  # run, since the float32 columns fit in 24 GiB (peaks of 2026-12-02: 6.1 + 2.9 + 8.2 + 4.9 GB,
  # never all at once). Result named after the ISA (and TAG), beside the other machines' runs.
  local isa
  isa=$(cpu_isa)$TAG
  "$SC" --model "$FIX/full_0.3b_torchscript.pt2" --onnx "$ONNX/full_0.3b_torchscript.onnx" \
    --modes original-python,portable,onnxruntime,openvino-f32 --dtype float32 \
    --sizes 1024x768 "${COMMON[@]}" \
    --json "$RES/cpu-peers-full_0.3b-$isa.json"
}

step_s2_04_f32() {
  need_res
  # Sapiens2 0.4b where the library refuses bfloat16: float32 only, in two runs for memory (the
  # five columns' peaks of 2026-12-02 add up to about 20 GB), each with the library's column.
  local isa
  isa=$(cpu_isa)$TAG
  "$SC" --model "$FIX/s2_full_0.4b.safetensors" \
    --modes original-python,portable,transformers --dtype float32 \
    --sizes 1024x768 "${COMMON[@]}" \
    --json "$RES/cpu-peers-s2_full_0.4b-$isa-a.json"
  "$SC" --model "$FIX/s2_full_0.4b.safetensors" --onnx "$ONNX/s2_full_0.4b.onnx" \
    --modes "portable,onnxruntime,$(ov_modes)" --dtype float32 \
    --sizes 1024x768 "${COMMON[@]}" \
    --json "$RES/cpu-peers-s2_full_0.4b-$isa-b.json"
}

step_s2_04() {
  need_res
  "$SC" --model "$FIX/s2_full_0.4b.safetensors" \
    --modes original-python,portable,transformers --dtype float32,bfloat16 \
    --sizes "$SIZES" "${COMMON[@]}" \
    --json "$RES/cpu-peers-s2_full_0.4b$TAG-a.json"
  "$SC" --model "$FIX/s2_full_0.4b.safetensors" --onnx "$ONNX/s2_full_0.4b.onnx" \
    --modes portable,onnxruntime,openvino --dtype float32,bfloat16 \
    --sizes "$SIZES" "${COMMON[@]}" \
    --json "$RES/cpu-peers-s2_full_0.4b$TAG-b.json"
}

step_s2_1b() {
  need_res
  # Four runs, each with the library's columns (ratios within a run). At 1b (5.9 GB of float32)
  # three OpenVINO/ONNX Runtime columns beside the library's two outgrow 24 GiB: on 2026-12-03 the
  # kernel killed ONNX Runtime's worker in its first call, and the float32 column, whose weights
  # are the mapped file, ran 14 % slower than in the run before as its pages were evicted and
  # read again. So each ONNX peer runs in a run of its own.
  local mf="$FIX/s2_full_1b.safetensors" mo="$ONNX/s2_full_1b.onnx"
  local r="$RES/cpu-peers-s2_full_1b$TAG"
  "$SC" --model "$mf" --modes original-python,portable,transformers --dtype float32,bfloat16 \
    --sizes 1024x768 "${COMMON[@]}" --json "$r-a.json"
  "$SC" --model "$mf" --onnx "$mo" --modes portable,openvino-f32 --dtype float32,bfloat16 \
    --sizes 1024x768 "${COMMON[@]}" --json "$r-b.json"
  "$SC" --model "$mf" --onnx "$mo" --modes portable,openvino-default --dtype float32,bfloat16 \
    --sizes 1024x768 "${COMMON[@]}" --json "$r-c.json"
  # ONNX Runtime runs float32 only: the library's float32 column is the one to compare.
  "$SC" --model "$mf" --onnx "$mo" --modes portable,onnxruntime --dtype float32 \
    --sizes 1024x768 "${COMMON[@]}" --json "$r-d.json"
}

step_large() {
  need_res
  # For runs made with SIZES=1024x768 (the default SIZES has v1 and s2-0.4b at 3000x4000 already):
  # 3000x4000 (a phone photo) beside the authors' pipeline and OpenVINO, one run per model: the
  # network is the 1024x768 pass, so what is added is the resize in and the full-size upsample +
  # argmax out. About 15 min each on a 2-core AMX Xeon (2026-12-02/03).
  local m
  for m in full_0.3b_torchscript.pt2 s2_full_0.4b.safetensors; do
    local name=${m%_torchscript.pt2}
    name=${name%.safetensors}
    "$SC" --model "$FIX/$m" --onnx "$ONNX/${m%.*}.onnx" --modes original-python,portable,openvino \
      --dtype float32,bfloat16 --sizes 3000x4000 "${COMMON[@]}" \
      --json "$RES/cpu-peers-$name$TAG-3000x4000.json"
  done
}

step_memory_5b() {
  need_res
  # Peak RSS of load + one 1024x768 call of Sapiens2 5B, bfloat16 and float32 (mapped), beside
  # the authors' load_file + load_state_dict path (measured where it fits, else estimated and
  # measured on 0.4b for its peak-to-file ratio). Needs ~21 GB of disk for the file.
  [ -f "$FIX/s2_full_5b.safetensors" ] ||
    "$PY" tests/fixtures/sapiens2.py --out "$FIX" --only s2_full_5b
  "$PY" benchmarks/peak_memory.py --model "$FIX/s2_full_5b.safetensors" \
    --cli "$BUILD/bin/sapiens-seg" --dtypes bfloat16,float32 \
    --authors-model "$FIX/s2_full_0.4b.safetensors" --json "$RES/cpu-memory-s2_5b.json"
  log "delete $FIX/s2_full_5b.safetensors when done (20.4 GB); the generator rebuilds it"
}

step_kernels() {
  need_res
  cmake --build "$BUILD" --target attention_bench head_bench mlp_bench -- -j"$(nproc)"
  local b
  for b in attention_bench head_bench mlp_bench; do
    "$BUILD/bin/$b" --json "$RES/cpu-${b%_bench}$TAG.json"
  done
}

step_profiles() {
  need_res
  # The binding of this build (not the one build/python holds, which the venv finds by default).
  cmake --build "$BUILD" --target sapiens_seg_python -- -j"$(nproc)"
  local m
  for m in full_0.3b_torchscript.pt2 s2_full_0.4b.safetensors; do
    local name=${m%_torchscript.pt2}
    name=${name%.safetensors}
    PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" \
      "$PY" benchmarks/profile_peers.py --model "$FIX/$m" --onnx "$ONNX/${m%.*}.onnx" --calls 1 \
        --dtypes float32 --gemm-shapes --json "$RES/cpu-profile-$name$TAG-f32.json"
  done
}

step_readme() {
  # Every machine folder's speed_check results; a new folder needs no change here.
  "$PY" benchmarks/readme_performance.py
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
for s in "${steps[@]}"; do
  case "$s" in
    all) need_res; step_setup; step_fixtures; step_probe; step_v1; step_s2_04; step_s2_1b
         step_memory_5b
         step_readme ;;
    setup) step_setup ;;
    fixtures) step_fixtures ;;
    probe) step_probe ;;
    v1) step_v1 ;;
    v1-f32) step_v1_f32 ;;
    s2-0.4b) step_s2_04 ;;
    s2-0.4b-f32) step_s2_04_f32 ;;
    s2-1b) step_s2_1b ;;
    large) step_large ;;
    memory-5b) step_memory_5b ;;
    kernels) step_kernels ;;
    profiles) step_profiles ;;
    readme) step_readme ;;
    *) echo "run_cpu_peers.sh: unknown step $s" >&2; exit 2 ;;
  esac
done
