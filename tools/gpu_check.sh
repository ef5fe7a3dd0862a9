#!/usr/bin/env bash
# The GPU checks of the kernels backend, as one script for the GPU machine (see the project's
# device notes): build the core (no IO dependencies) with the CUDA kernels for sm_90 against
# that machine's torch, generate the fixtures with its torch, run the gpu tests (each kernel
# against ATen, whole-network parity) and the speed check when it is built, print a table last
# and write everything under $OUT.
#
#   tools/gpu_check.sh --prepare    on the development machine: copy the header-only pieces the
#                                   GPU machine lacks (nlohmann/json, GoogleTest sources,
#                                   cudnn-frontend) into third_party/_carry (git-ignored), to be
#                                   named in the device tool's `carry`
#   tools/gpu_check.sh              on the GPU machine (results in $OUT)
#   tools/gpu_check.sh --rehearse   here, without a GPU: every step up to the first CUDA call
#                                   (the gpu tests then skip, saying why)
#
# Environment: OUT (results folder; default build-gpu/results), CUDA_ARCHS (default 90),
# GPU_CHECK_PY (Python with torch; default .venv/bin/python, else python3), SPEED_ARGS (extra
# arguments for benchmarks/speed_check), SPEED_S2_ARGS / SPEED_S2=0 (the Sapiens2 speed check on
# s2_tiny, portable against kernels), GPU_CHECK_FIXTURES (names for tools/gpu_fixtures.py).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
carry=$root/third_party/_carry
mode=run
for a in "$@"; do
  case "$a" in
    --prepare) mode=prepare ;;
    --rehearse) mode=rehearse ;;
    *) echo "gpu_check.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
log() { printf '[gpu_check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -z "${GPU_CHECK_PY:-}" ]; then
  if [ -x .venv/bin/python ]; then GPU_CHECK_PY=$root/.venv/bin/python; else GPU_CHECK_PY=$(command -v python3); fi
fi
PY=$GPU_CHECK_PY

# ---- --prepare: the header-only dependencies, copied for the trip ------------------------------
if [ "$mode" = prepare ]; then
  rm -rf "$carry"
  mkdir -p "$carry/json/include" "$carry/json/share/cmake" "$carry/cudnn_frontend"
  cp -r /usr/include/nlohmann "$carry/json/include/"
  # zlib's headers (the archive reader's CRC-32 and inflation), for a machine with only libz.so.1.
  mkdir -p "$carry/zlib/include"
  cp /usr/include/zlib.h "$(find /usr/include -name zconf.h | head -1)" "$carry/zlib/include/"
  cp -r /usr/share/cmake/nlohmann_json "$carry/json/share/cmake/"
  cp -r /usr/src/googletest "$carry/googletest-src"
  fe=$("$PY" -c "import importlib.metadata as m, os; f=[p for p in m.files('nvidia-cudnn-frontend') if str(p).endswith('include/cudnn_frontend.h')]; print(os.path.dirname(f[0].locate()))")
  cp -r "$fe" "$carry/cudnn_frontend/include"
  log "carry folder ready: $(du -sh "$carry" | cut -f1) in third_party/_carry (name it in carry)"
  exit 0
fi

[ -d "$carry/json" ] && [ -d "$carry/googletest-src" ] && [ -d "$carry/cudnn_frontend/include" ] ||
  { echo "gpu_check.sh: third_party/_carry is incomplete: run tools/gpu_check.sh --prepare first" >&2; exit 2; }

if [ "$mode" = rehearse ]; then
  build=$root/build-gpu-rehearsal
else
  build=$root/build-gpu
fi
OUT=${OUT:-$build/results}
mkdir -p "$OUT" "$build"
archs=${CUDA_ARCHS:-90}
t_start=$(date +%s)

# ---- what machine this is ----------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "mode: $mode"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /'
  else
    echo "gpu: none (nvidia-smi not found)"
  fi
  "$PY" -c "import torch; print('torch:', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'devices', torch.cuda.device_count())"
  echo "nvcc: $(nvcc --version | tail -1)"
} | tee "$OUT/environment.txt"

# ---- GoogleTest from the carried sources (the GPU machine has no libgtest-dev) -----------------
gtest_prefix=$build/_gtest
if [ ! -f "$gtest_prefix/lib/cmake/GTest/GTestConfig.cmake" ]; then
  log "building GoogleTest from third_party/_carry/googletest-src"
  cmake -S "$carry/googletest-src" -B "$build/_gtest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DCMAKE_INSTALL_PREFIX="$gtest_prefix" >"$OUT/gtest_build.log" 2>&1
  cmake --build "$build/_gtest-build" --target install >>"$OUT/gtest_build.log" 2>&1
fi

# ---- configure and build the core + kernels + tests (+ speed_check) ----------------------------
bench=OFF
[ -f benchmarks/CMakeLists.txt ] && bench=ON
log "configuring (core only, CUDA architectures $archs, benchmarks $bench)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSAPIENS_SEG_BUILD_IO=OFF -DSAPIENS_SEG_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$archs" \
  -DSAPIENS_SEG_BUILD_BENCHMARKS=$bench -DSAPIENS_SEG_PYTHON="$PY" \
  -DCMAKE_PREFIX_PATH="$carry/json;$carry/zlib;$gtest_prefix" \
  -DSAPIENS_SEG_CUDNN_FRONTEND_INCLUDE="$carry/cudnn_frontend/include" >"$OUT/configure.log" 2>&1 ||
  { tail -40 "$OUT/configure.log"; exit 1; }
grep -E "sapiens-seg:" "$OUT/configure.log" >&2 || true
grep -q "kernels backend on" "$OUT/configure.log" ||
  { echo "gpu_check.sh: the kernels backend was not configured (see $OUT/configure.log)" >&2; exit 1; }
targets=(kernels_host_tests kernels_gpu_tests)
[ "$bench" = ON ] && targets+=(speed_check)
log "building ${targets[*]}"
t0=$(date +%s)
cmake --build "$build" --target "${targets[@]}" >"$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
log "built in $(( $(date +%s) - t0 )) s"

# ---- fixtures, made with this machine's torch --------------------------------------------------
fixtures=$build/gpu-fixtures
log "fixtures: ${GPU_CHECK_FIXTURES:-tiny_b wide_0.3b s2_tiny}"
# shellcheck disable=SC2086
"$PY" tools/gpu_fixtures.py --out "$fixtures" --only ${GPU_CHECK_FIXTURES:-tiny_b wide_0.3b s2_tiny} \
  2>&1 | tee "$OUT/fixtures.log" >&2

# ---- the tests -----------------------------------------------------------------------------------
export SAPIENS_SEG_FIXTURES=$fixtures
status=0
for t in kernels_host_tests kernels_gpu_tests; do
  log "running $t"
  "$build/bin/$t" --gtest_output="json:$OUT/$t.json" >"$OUT/$t.log" 2>&1 || status=1
done
grep -h "^parity \|^device: " "$OUT/kernels_gpu_tests.log" >&2 || true

# ---- the speed check (benchmarks/speed_check, when this tree has it) ---------------------------
if [ -x "$build/bin/speed_check" ]; then
  log "speed_check ${SPEED_ARGS:---quick --device cuda --dtype float16}"
  # shellcheck disable=SC2086
  "$build/bin/speed_check" ${SPEED_ARGS:---quick --device cuda --dtype float16} \
    --json "$OUT/speed.json" --markdown "$OUT/speed.md" >"$OUT/speed.log" 2>&1 || status=1
  # Sapiens2 (no original mode): portable against kernels on the s2_tiny fixture.
  rm -f "$OUT"/speed_s2.*  # never report an earlier run's figures
  if [ -f "$fixtures/s2_tiny.safetensors" ] && [ "${SPEED_S2:-1}" != 0 ]; then
    log "speed_check (Sapiens2) ${SPEED_S2_ARGS:---quick --device cuda --dtype float16}"
    # shellcheck disable=SC2086
    "$build/bin/speed_check" ${SPEED_S2_ARGS:---quick --device cuda --dtype float16} \
      --model "$fixtures/s2_tiny.safetensors" --modes portable,kernels \
      --json "$OUT/speed_s2.json" --markdown "$OUT/speed_s2.md" >"$OUT/speed_s2.log" 2>&1 || status=1
  fi
else
  echo "speed_check: not built in this tree (benchmarks/ absent)" >"$OUT/speed.log"
fi

# ---- the table ---------------------------------------------------------------------------------
"$PY" - "$OUT" "$(( $(date +%s) - t_start ))" <<'EOF' | tee "$OUT/summary.md"
import json, os, sys
out, seconds = sys.argv[1], sys.argv[2]
def skip_reasons(log_path):
    """GoogleTest's JSON has no skip message: take it from the log (the line after 'Skipped')."""
    reasons, current, grab = {}, None, False
    for line in open(log_path) if os.path.exists(log_path) else []:
        line = line.rstrip("\n")
        if line.startswith("[ RUN      ] "):
            current, grab = line[13:].strip(), False
        elif line.endswith(": Skipped"):
            grab = True
        elif grab and current:
            reasons[current], grab = line.strip(), False
    return reasons

rows = []
for exe in ("kernels_host_tests", "kernels_gpu_tests"):
    reasons = skip_reasons(os.path.join(out, exe + ".log"))
    path = os.path.join(out, exe + ".json")
    if not os.path.exists(path):
        rows.append((exe, "-", "no result (crashed?)", "", ""))
        continue
    for suite in json.load(open(path))["testsuites"]:
        for t in suite["testsuite"]:
            status = "FAILED" if t.get("failures") else (
                "skipped" if t.get("result") == "SKIPPED" else "passed")
            why = ""
            if status == "skipped":
                why = reasons.get(suite["name"] + "." + t["name"], "")
            if status == "FAILED":
                why = t["failures"][0]["failure"].splitlines()[0][:100]
            rows.append((exe, suite["name"] + "." + t["name"], status, t.get("time", ""), why))
print(f"\n| binary | test | result | time | note |\n|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(str(x).replace("|", "/").replace("\n", " ")[:120] for x in r) + " |")
n = {s: sum(r[2] == s for r in rows) for s in ("passed", "FAILED", "skipped")}
log = os.path.join(out, "kernels_gpu_tests.log")
parity = [l.strip() for l in open(log)] if os.path.exists(log) else []
parity = [l for l in parity if l.startswith("parity ")]
if parity:
    print("\nparity (fp16 vs the reference logits; bars: mean <= 0.05, p99 <= 0.25, labels >= 99.5 %):")
    for l in parity:
        print("  " + l)
for name in ("speed.md", "speed_s2.md"):
    speed = os.path.join(out, name)
    if os.path.exists(speed):
        print("\n" + open(speed).read())
print(f"\n{n['passed']} passed, {n['FAILED']} failed, {n['skipped']} skipped ({seconds} s in all)")
EOF
exit $status
