#!/usr/bin/env bash
# The GPU checks of the CUDA path as ONE command for a lent GPU machine (docs/gpu-check.md): build
# the core (no IO dependencies) with the CUDA kernels for sm_90 against that machine's torch while
# the fixtures are made with its torch, run the GPU tests (each kernel against an ATen or float64
# reference, whole-network parity, CUDA-graph capture) and the full-size speed step, and leave at
# most eight files in $OUT, refreshed after every step so a run cut short still returns its logs.
#
#   tools/gpu/gpu_check.sh --prepare   on the development machine: copy the header-only pieces
#                                      the GPU machine lacks (nlohmann/json, GoogleTest sources,
#                                      zlib's headers, cudnn-frontend) into third_party/_carry
#                                      (git-ignored), the folder to carry along
#   tools/gpu/gpu_check.sh             on the GPU machine (results in $OUT)
#   tools/gpu/gpu_check.sh --rehearse  without a GPU: every step up to the first CUDA call (the
#                                      GPU tests skip, saying why; speed_check reports CUDA
#                                      unavailable); the step limits are reported, not enforced,
#                                      since a 2-core machine builds several times slower
#
# Steps and their limits (seconds, each also cut to what is left of GPU_CHECK_BUDGET_S = 540):
#   preflight 20, configure 60, build 210 (fixtures alongside, in the background), gpu_tests 130,
#   speed 120. A step that fails or runs out of time is recorded in the summary; only a failed
#   preflight, configure or build stops the run (nothing after them could run).
#
# Environment: OUT (default <build>/results), CUDA_ARCHS (90), GPU_CHECK_PY (Python with torch;
# default .venv/bin/python, else python3), GPU_CHECK_BUDGET_S (540), GPU_CHECK_JOBS (build jobs;
# default: all cores), GPU_CHECK_FIXTURES (default "tiny_b s2_tiny wide_0.3b full_0.3b"),
# GPU_CHECK_TESTS (a --gtest_filter for the GPU tests; default all), SPEED_ARGS (replaces the speed
# step's protocol arguments), GPU_CHECK_BUILD (the build folder).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
carry=$root/third_party/_carry
mode=run
for a in "$@"; do
  case "$a" in
    --prepare) mode=prepare ;;
    --rehearse) mode=rehearse ;;
    -h | --help) sed -n '2,28p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
log() { printf '[gpu_check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -z "${GPU_CHECK_PY:-}" ]; then
  if [ -x .venv/bin/python ]; then
    GPU_CHECK_PY=$root/.venv/bin/python
  else
    GPU_CHECK_PY=$(command -v python3)
  fi
fi
PY=$GPU_CHECK_PY

# ---- --prepare: the header-only dependencies, copied for the trip ------------------------------
if [ "$mode" = prepare ]; then
  set -e
  rm -rf "$carry"
  mkdir -p "$carry/json/include" "$carry/json/share/cmake" "$carry/cudnn_frontend"
  cp -r /usr/include/nlohmann "$carry/json/include/"
  cp -r /usr/share/cmake/nlohmann_json "$carry/json/share/cmake/"
  # zlib's headers (the archive reader's CRC-32 and inflation), for a machine with only libz.so.1.
  # The compiler's own zconf.h: other packages ship different ones (Node's, under
  # /usr/include/node, breaks zlib.h's prototypes).
  mkdir -p "$carry/zlib/include"
  zconf=""
  for f in /usr/include/zconf.h "/usr/include/$(gcc -dumpmachine)/zconf.h"; do
    [ -f "$f" ] && { zconf=$f; break; }
  done
  cp /usr/include/zlib.h "$zconf" "$carry/zlib/include/"
  cp -r /usr/src/googletest "$carry/googletest-src"
  # The GPU machine has no nvidia-cudnn-frontend: its headers come from this machine's package.
  fe=$("$PY" -c "import importlib.metadata as m, os
f = [p for p in m.files('nvidia-cudnn-frontend') if str(p).endswith('include/cudnn_frontend.h')]
print(os.path.dirname(f[0].locate()))")
  cp -r "$fe" "$carry/cudnn_frontend/include"
  "$PY" -c "import importlib.metadata as m; print(m.version('nvidia-cudnn-frontend'))" \
    >"$carry/cudnn_frontend/VERSION"
  kib=$(du -sk "$carry" | cut -f1)
  if [ "$kib" -ge $((60 * 1024)) ]; then
    echo "gpu_check.sh: the carry folder is $kib KiB, over the 64 MiB a trip allows" >&2
    exit 1
  fi
  log "carry folder ready: $((kib / 1024)) MiB in third_party/_carry" \
    "(cudnn-frontend $(cat "$carry/cudnn_frontend/VERSION"))"
  exit 0
fi

if [ "$mode" = rehearse ]; then
  build=${GPU_CHECK_BUILD:-$root/build-gpu-rehearsal}
else
  build=${GPU_CHECK_BUILD:-$root/build-gpu}
fi
OUT=${OUT:-$build/results}
logs=$build/logs          # everything besides the few files $OUT holds; tarred into $OUT
fixtures=$build/gpu-fixtures
mkdir -p "$OUT" "$build" "$logs"
# Never report an earlier run's results.
rm -f "$logs"/* "$OUT"/{summary.md,steps.json,kernels_gpu_tests.log,kernels_gpu_tests.json} \
  "$OUT"/{speed.json,speed.md,rest.tar.gz} 2>/dev/null
budget=${GPU_CHECK_BUDGET_S:-540}
archs=${CUDA_ARCHS:-90}
jobs=${GPU_CHECK_JOBS:-$(nproc)}
t_start=$(date +%s)
steps_tsv=$logs/steps.tsv
: >"$steps_tsv"

# ---- step bookkeeping --------------------------------------------------------------------------
# limit_for BUDGET: the step's own limit, cut to what is left of the whole budget (5 s are kept
# for the summary). In rehearsal the limit is only reported.
limit_for() {
  local want=$1 left
  [ "$mode" = rehearse ] && { echo "$want"; return; }
  left=$((budget - ($(date +%s) - t_start) - 5))
  [ "$left" -lt 1 ] && left=1
  [ "$want" -lt "$left" ] && echo "$want" || echo "$left"
}
# timed LIMIT CMD...: CMD under `timeout` (not in rehearsal), its exit status (124: out of time).
timed() {
  local limit=$1
  shift
  if [ "$mode" = rehearse ]; then
    "$@"
  else
    timeout --kill-after=5 "$limit" "$@"
  fi
}
# record NAME STATUS SECONDS LIMIT NOTE, then refresh $OUT.
record() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5//$'\t'/ }" >>"$steps_tsv"
  log "step $1: $2 in $3 s (limit $4 s)${5:+: $5}"
  refresh_out
}
status_of() {  # exit code -> passed / failed / timed out
  case "$1" in 0) echo passed ;; 124 | 137) echo "timed out" ;; *) echo "failed (exit $1)" ;; esac
}

# $OUT holds at most eight files: summary.md, steps.json, kernels_gpu_tests.{log,json},
# speed.json, speed.md and rest.tar.gz (every other log). Rewritten after each step.
refresh_out() {
  {
    printf '{\n  "mode": "%s",\n  "budget_s": %s,\n  "elapsed_s": %s,\n  "steps": [' \
      "$mode" "$budget" "$(($(date +%s) - t_start))"
    local first=1 name st secs lim note
    while IFS=$'\t' read -r name st secs lim note; do
      [ $first = 1 ] || printf ','
      first=0
      note=${note//\\/\\\\}
      note=${note//\"/\\\"}
      printf '\n    {"step": "%s", "status": "%s", "seconds": %s, "limit_s": %s, "note": "%s"}' \
        "$name" "$st" "$secs" "$lim" "$note"
    done <"$steps_tsv"
    printf '\n  ]\n}\n'
  } >"$OUT/steps.json"
  for f in kernels_gpu_tests.log kernels_gpu_tests.json speed.json speed.md; do
    [ -f "$logs/$f" ] && cp "$logs/$f" "$OUT/$f"
  done
  write_summary >"$OUT/summary.md" 2>>"$logs/summary.err" || true
  tar -czf "$OUT/rest.tar.gz.tmp" -C "$build" logs 2>/dev/null &&
    mv "$OUT/rest.tar.gz.tmp" "$OUT/rest.tar.gz"
}

write_summary() {
  echo "# gpu_check ($mode), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  [ -f "$logs/preflight.txt" ] && sed 's/^/    /' "$logs/preflight.txt" && echo
  echo "| step | result | seconds | limit | note |"
  echo "|---|---|---:|---:|---|"
  while IFS=$'\t' read -r name st secs lim note; do
    echo "| $name | $st | $secs | $lim | ${note//|//} |"
  done <"$steps_tsv"
  echo
  echo "$(($(date +%s) - t_start)) s of the $budget s budget used."
  # The tests' table, parity and graph-capture lines, and the speed table (Python; the table above
  # stands alone where Python does not start).
  "$PY" - "$logs" <<'EOF'
import json, os, sys
logs = sys.argv[1]
log_path = os.path.join(logs, "kernels_gpu_tests.log")
lines = open(log_path, errors="replace").read().splitlines() if os.path.exists(log_path) else []
reasons, current, grab = {}, None, False
for line in lines:  # GoogleTest's JSON has no skip message: the line after "Skipped" has it
    if line.startswith("[ RUN      ] "):
        current, grab = line[13:].strip(), False
    elif line.endswith(": Skipped"):
        grab = True
    elif grab and current:
        reasons[current], grab = line.strip(), False
rows = []
path = os.path.join(logs, "kernels_gpu_tests.json")
if os.path.exists(path):
    for suite in json.load(open(path))["testsuites"]:
        for t in suite["testsuite"]:
            name = suite["name"] + "." + t["name"]
            if t.get("failures"):
                st, why = "FAILED", t["failures"][0]["failure"].splitlines()[0][:110]
            elif t.get("result") == "SKIPPED":
                st, why = "skipped", reasons.get(name, "")
            else:
                st, why = "passed", ""
            rows.append((name, st, t.get("time", ""), why))
if rows:
    print("\n| GPU test | result | time | note |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x).replace("|", "/") for x in r) + " |")
    n = {s: sum(r[1] == s for r in rows) for s in ("passed", "FAILED", "skipped")}
    print(f"\nGPU tests: {n['passed']} passed, {n['FAILED']} failed, {n['skipped']} skipped")
elif lines:
    print("\nGPU tests: no JSON result (crashed or cut short); the log's last lines:\n")
    for l in lines[-15:]:
        print("    " + l)
for prefix, title in (("parity ", "Parity (bars: mean <= 0.05, p99 <= 0.25, labels >= 99.5 %)"),
                      ("graphs ", "CUDA graphs (captured / eager shapes, and why)"),
                      ("device: ", "Device"), ("tf32 ", "Reference precision")):
    found = [l.strip() for l in lines if l.startswith(prefix)]
    if found:
        print(f"\n{title}:")
        for l in found:
            print("  " + l)
md = os.path.join(logs, "speed.md")
if os.path.exists(md):
    print("\n" + open(md).read())
EOF
}

# ---- 1. preflight: what this machine has, before any minute goes to a build -------------------
step_t0=$(date +%s)
lim=$(limit_for 20)
log "preflight (limit $lim s)"
timed "$lim" "$PY" - "$carry" >"$logs/preflight.txt" 2>"$logs/preflight.err" <<'EOF'
import glob, os, shutil, subprocess, sys
carry = sys.argv[1]
problems = []
def say(k, v):
    print(f"{k}: {v}", flush=True)
try:
    import torch
except Exception as e:  # nothing else can run
    say("torch", f"cannot import: {e}")
    sys.exit(1)
site = os.path.dirname(os.path.dirname(torch.__file__))
say("python", sys.version.split()[0] + " " + sys.executable)
say("torch", f"{torch.__version__} (CUDA {torch.version.cuda}, "
    f"cuDNN {torch.backends.cudnn.version()})")
say("torch headers", "ok" if os.path.exists(os.path.join(os.path.dirname(torch.__file__),
    "include", "ATen", "ATen.h")) else "MISSING")
cudnn_h = glob.glob(os.path.join(site, "nvidia", "cudnn", "include", "cudnn_version.h"))
if cudnn_h:
    v = {}
    for line in open(cudnn_h[0]):
        p = line.split()
        if len(p) == 3 and p[0] == "#define" and p[1] in ("CUDNN_MAJOR", "CUDNN_MINOR",
                                                           "CUDNN_PATCHLEVEL"):
            v[p[1]] = p[2]
    say("cudnn.h", f"{v.get('CUDNN_MAJOR')}.{v.get('CUDNN_MINOR')}.{v.get('CUDNN_PATCHLEVEL')} "
        "(nvidia-cudnn wheel)")
else:
    say("cudnn.h", "MISSING (the kernels backend needs it)")
    problems.append("cudnn.h")
fe = os.path.join(carry, "cudnn_frontend", "include", "cudnn_frontend.h")
fe_v = os.path.join(carry, "cudnn_frontend", "VERSION")
say("cudnn_frontend.h", ("carried, " + open(fe_v).read().strip()) if os.path.exists(fe_v) else
    ("carried" if os.path.exists(fe) else "MISSING"))
if not os.path.exists(fe):
    problems.append("cudnn_frontend.h")
for name, rel in (("nlohmann/json", "json/include/nlohmann/json.hpp"),
                  ("googletest", "googletest-src/CMakeLists.txt"),
                  ("zlib.h", "zlib/include/zlib.h")):
    ok = os.path.exists(os.path.join(carry, rel))
    say(name, "carried" if ok else "MISSING")
    if not ok:
        problems.append(name)
nvrtc = sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so*")))
say("libnvrtc", nvrtc[0].replace(site + "/", "") if nvrtc else "not in the wheels (cuDNN's "
    "runtime-compiled attention kernels need it)")
for tool, arg in (("nvcc", "--version"), ("cmake", "--version"), ("ninja", "--version")):
    path = shutil.which(tool) or (tool == "nvcc" and os.path.exists("/usr/local/cuda/bin/nvcc")
                                  and "/usr/local/cuda/bin/nvcc")
    if not path:
        say(tool, "MISSING")
        problems.append(tool)
        continue
    out = subprocess.run([path, arg], capture_output=True, text=True).stdout.strip().splitlines()
    say(tool, out[-1] if tool == "nvcc" else out[0])
smi = shutil.which("nvidia-smi")
if smi:
    r = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                        "--format=csv,noheader"], capture_output=True, text=True, timeout=8)
    say("gpu", r.stdout.strip() or r.stderr.strip() or "none")
else:
    say("gpu", "none (no nvidia-smi)")
# The CPU by vendor, family, model and stepping (one name covers generations that differ 2x).
sys.path.insert(0, "benchmarks")
from machine_facts import parse_cpuinfo
try:
    cpu = parse_cpuinfo(open("/proc/cpuinfo", encoding="ascii", errors="replace").read())
except OSError:
    cpu = parse_cpuinfo("")
say("cpu", f"{os.cpu_count()} logical cores; {cpu['name']}, {cpu['vendor']} family "
    f"{cpu['family']} model {cpu['model']} stepping {cpu['stepping']}"
    + (f" ({cpu['microarchitecture']})" if cpu["microarchitecture"] else "")
    + f"; {' '.join(cpu['isa_flags'])}")
if problems:
    say("missing", ", ".join(problems))
    sys.exit(1)
EOF
rc=$?
cat "$logs/preflight.txt" >&2
record preflight "$(status_of $rc)" $(($(date +%s) - step_t0)) "$lim" \
  "$(grep -m1 '^gpu:' "$logs/preflight.txt" | cut -c6-)"
[ $rc = 0 ] || { log "preflight failed: see $logs/preflight.err"; exit 1; }
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

# ---- 2. configure: GoogleTest from the carried sources, then the core-gpu preset ---------------
step_t0=$(date +%s)
lim=$(limit_for 60)
log "configure (limit $lim s; CUDA architectures $archs)"
gtest_prefix=$build/_gtest
configure() {
  if [ ! -f "$gtest_prefix/lib/cmake/GTest/GTestConfig.cmake" ]; then
    cmake -S "$carry/googletest-src" -B "$build/_gtest-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
      -DCMAKE_INSTALL_PREFIX="$gtest_prefix" &&
      cmake --build "$build/_gtest-build" --target install -j "$jobs" || return 1
  fi
  # LibTorch (and with it cuDNN's headers and libraries) from $PY's torch, named explicitly: left
  # to itself, CMake would take the checkout's .venv where there is one. No ISA-L: the GPU
  # machine has none, and a rehearsal must build what it builds.
  cmake --preset core-gpu -B "$build" -DCMAKE_CUDA_ARCHITECTURES="$archs" \
    -DSAPIENS_SEG_PYTHON="$PY" -DTorch_DIR="$torch_dir" -DSAPIENS_SEG_ISAL=OFF \
    -DCMAKE_PREFIX_PATH="$carry/json;$carry/zlib;$gtest_prefix" \
    -DSAPIENS_SEG_CUDNN_FRONTEND_INCLUDE="$carry/cudnn_frontend/include"
}
torch_dir=$("$PY" -c \
  "import os, torch.utils; print(os.path.join(torch.utils.cmake_prefix_path, 'Torch'))")
export -f configure
export gtest_prefix carry build jobs archs PY torch_dir
timed "$lim" bash -c configure >"$logs/configure.log" 2>&1
rc=$?
note=$(grep -E "sapiens-seg: (kernels backend|CUDA|LibTorch)" "$logs/configure.log" |
  sed 's/.*sapiens-seg: //' | cut -c1-70 | paste -sd ';' -)
if [ $rc = 0 ] && ! grep -q "kernels backend on" "$logs/configure.log"; then
  rc=1
  note="the kernels backend was not configured; $note"
fi
record configure "$(status_of $rc)" $(($(date +%s) - step_t0)) "$lim" "$note"
[ $rc = 0 ] || { tail -30 "$logs/configure.log" >&2; exit 1; }

# ---- 3. build the device run's targets, with the fixtures made alongside -----------------------
# Only what runs here: the GPU tests and speed_check (the host tests are CI's).
step_t0=$(date +%s)
lim=$(limit_for 210)
targets=(kernels_gpu_tests speed_check)
log "build ${targets[*]} with $jobs jobs (limit $lim s); fixtures in the background"
fixture_list=${GPU_CHECK_FIXTURES:-tiny_b s2_tiny wide_0.3b full_0.3b}
fixtures_deadline=$((step_t0 + lim))
: >"$logs/fixtures.tsv"
(
  # One process per fixture, the tests' small ones first: one failing leaves the others. They
  # share the build step's time limit and half the cores.
  for f in $fixture_list; do
    t0=$(date +%s)
    left=$((fixtures_deadline - t0))
    [ "$left" -lt 1 ] && left=1
    timed "$left" "$PY" tests/fixtures/gpu.py --out "$fixtures" --threads "$(((jobs + 1) / 2))" \
      --only "$f" >"$logs/fixture_$f.log" 2>&1
    printf '%s\t%s\t%s\n' "$f" "$(status_of $?)" $(($(date +%s) - t0)) >>"$logs/fixtures.tsv"
  done
) &
fixtures_pid=$!
timed "$lim" cmake --build "$build" --target "${targets[@]}" -j "$jobs" >"$logs/build.log" 2>&1
rc=$?
record build "$(status_of $rc)" $(($(date +%s) - step_t0)) "$lim" \
  "$(grep -c '^\[' "$logs/build.log") build steps$(grep -m1 -E 'error:|FAILED:' "$logs/build.log" |
    cut -c1-90 | sed 's/^/; /')"
# A failed build ends the run: the fixtures still being made would only spend the loan's time.
kill_tree() {
  local c
  for c in $(pgrep -P "$1"); do kill_tree "$c"; done
  kill "$1" 2>/dev/null
}
[ $rc = 0 ] || kill_tree "$fixtures_pid"
wait "$fixtures_pid"
fx_note=$(awk -F'\t' '{printf "%s%s %s %ss", (NR>1?"; ":""), $1, $2, $3}' "$logs/fixtures.tsv")
fx_status=passed
grep -qv $'\tpassed\t' "$logs/fixtures.tsv" && fx_status=failed
[ $rc = 0 ] || fx_status="stopped (the build failed)"
# The fixtures ran one after another beside the build: their own time is the sum.
record fixtures "$fx_status" "$(awk -F'\t' '{s += $3} END {print s + 0}' "$logs/fixtures.tsv")" \
  "$lim" "$fx_note"
[ $rc = 0 ] || { tail -40 "$logs/build.log" >&2; exit 1; }

# ---- 4. the GPU tests ---------------------------------------------------------------------------
step_t0=$(date +%s)
lim=$(limit_for 130)
log "kernels_gpu_tests (limit $lim s)"
export SAPIENS_SEG_FIXTURES=$fixtures
timed "$lim" "$build/bin/kernels_gpu_tests" --gtest_filter="${GPU_CHECK_TESTS:-*}" \
  --gtest_output="json:$logs/kernels_gpu_tests.json" >"$logs/kernels_gpu_tests.log" 2>&1
rc=$?
note=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ tests?' "$logs/kernels_gpu_tests.log" |
  sed 's/, listed below://; s/^\[ *//; s/ *\] / /' | paste -sd ',' -)
record gpu_tests "$(status_of $rc)" $(($(date +%s) - step_t0)) "$lim" "$note"
status=$rc

# ---- 5. the speed step: the full 0.3b shape at 1024x2048 ----------------------------------------
step_t0=$(date +%s)
lim=$(limit_for 120)
model=$fixtures/full_0.3b_torchscript.pt2
note=""
if [ ! -f "$model" ]; then
  model=$fixtures/tiny_b_torchscript.pt2
  note="full_0.3b fixture missing: tiny_b instead (not representative); "
fi
# The product goal's four columns: the authors' graph in fp32 and under autocast fp16 (as their
# demo would), the portable and kernels modes in fp16. One load each, 3 warm-up calls, median of
# 3 rounds x 5 calls, then the backbone/head split and the graph-capture counts per column.
default_speed="--sizes 1024x2048 --batch 1 --modes original,original-autocast,portable,kernels"
default_speed+=" --dtype float16 --load-repeats 1 --warmup 3 --rounds 3 --calls 5 --split"
# shellcheck disable=SC2206  # the arguments are words on purpose
speed_args=(${SPEED_ARGS:-$default_speed})
log "speed_check on $(basename "$model") (limit $lim s)"
if [ -f "$model" ]; then
  timed "$lim" "$build/bin/speed_check" --device cuda --model "$model" "${speed_args[@]}" \
    --json "$logs/speed.json" >"$logs/speed.log" 2>&1
  rc=$?
  # The tables, by the one renderer of the performance pages (standard library only).
  [ -s "$logs/speed.json" ] &&
    timed 20 "$PY" benchmarks/readme_performance.py --print "$logs/speed.json" \
      >"$logs/speed.md" 2>>"$logs/speed.log"
  note+=$(grep -E "^speed_check: .*(unavailable|failed|graphs)" "$logs/speed.log" |
    sed 's/^speed_check: *//' |
    cut -c1-100 | sort | uniq -c | sed 's/^ *1 //; s/^ *\([0-9]*\) /\1x /' | head -6 |
    paste -sd ';' -)
else
  rc=1
  note+="no fixture to time"
fi
record speed "$(status_of $rc)" $(($(date +%s) - step_t0)) "$lim" "$note"
[ $rc = 0 ] || status=1

refresh_out
cat "$OUT/summary.md"
log "done in $(($(date +%s) - t_start)) s; $OUT holds: $(ls "$OUT" | paste -sd ' ' -)"
exit $status
