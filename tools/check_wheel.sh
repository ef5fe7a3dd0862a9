#!/usr/bin/env bash
# Does the wheel install and work in a clean environment? Builds it (pip wheel, in the project's
# .venv), makes a fresh venv with nothing but the pinned torch (and what torch itself pulls in;
# pip's cache makes a second run fast), installs the wheel there, and in that venv: imports
# sapiens_seg, segments examples/astronaut.jpg with the tiny fixture checkpoint, checks that
# LibTorch and libsapiens_seg were loaded from the fresh venv (not from the build's), and runs
# `sapiens-seg --help` from the venv's bin/. Also checks that no binary in the wheel carries an
# absolute RPATH.
#
#   tools/check_wheel.sh [--keep]     # --keep leaves the scratch folder (wheel, venv) behind
#
# Not part of ctest: the first run downloads torch and its CUDA libraries (several GB) into
# pip's cache, and the wheel's CMake build compiles the project once more. Prints the elapsed
# time at the end; exit status 0 when every check passed.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
keep=0
for a in "$@"; do
  case "$a" in
    --keep) keep=1 ;;
    *) echo "check_wheel.sh: unknown option $a" >&2; exit 2 ;;
  esac
done

start=$(date +%s)
log() { printf '[check_wheel %4ds] %s\n' "$(($(date +%s) - start))" "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

py=$repo/.venv/bin/python
[ -x "$py" ] || fail "no .venv: run tools/setup.sh first"
torch_pin=$(sed -n 's/.*"torch==\([0-9.]*\)".*/\1/p' pyproject.toml | head -n1)
[ -n "$torch_pin" ] || fail "pyproject.toml pins no torch version"
# The fresh venv uses the interpreter .venv was made from, so the wheel's tag fits it.
base_python=$("$py" -c 'import sys; print(sys._base_executable)')

scratch=$(mktemp -d "${TMPDIR:-/tmp}/sapiens-seg-wheel.XXXXXX")
if [ "$keep" = 0 ]; then
  trap 'rm -rf "$scratch"' EXIT
else
  log "scratch folder: $scratch"
fi

# ---- 1. the wheel --------------------------------------------------------------------------
# A build folder one level below the repository, like build/, so that ccache (base_dir) finds
# the objects of the release build and only what differs is compiled again.
log "building the wheel (pip wheel --no-build-isolation, CMake in build-check-wheel/)"
"$py" -m pip wheel -q --no-build-isolation --no-deps -w "$scratch/dist" \
  --config-settings=build-dir=build-check-wheel . >"$scratch/wheel.log" 2>&1 ||
  { tail -n 40 "$scratch/wheel.log" >&2; fail "pip wheel failed (log above)"; }
wheel=$(ls "$scratch"/dist/sapiens_seg-*.whl)
log "wheel: $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"

# What it holds, and where its binaries look for libraries: only $ORIGIN-relative folders.
mkdir "$scratch/unpacked"
"$py" -m zipfile -e "$wheel" "$scratch/unpacked"
(cd "$scratch/unpacked" && find . -type f | sort | grep -v '\.dist-info/' | sed 's/^/  /') >&2
while IFS= read -r -d '' elf; do
  runpath=$(readelf -d "$elf" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
  log "$(basename "$elf"): RUNPATH $runpath"
  IFS=: read -ra entries <<<"$runpath"
  for e in "${entries[@]}"; do
    case "$e" in
      '$ORIGIN'*) ;;
      *) fail "$(basename "$elf") looks for libraries in $e (an absolute path of the build machine)" ;;
    esac
  done
done < <(find "$scratch/unpacked" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0)

# ---- 2. a clean venv with only the pinned torch ---------------------------------------------
log "fresh venv with torch==$torch_pin (from pip's cache when it is there)"
"$base_python" -m venv "$scratch/venv"
venv_py=$scratch/venv/bin/python
"$venv_py" -m pip install -q --upgrade pip
"$venv_py" -m pip install -q "torch==$torch_pin"
"$venv_py" -m pip freeze >"$scratch/before.txt"
log "installing the wheel"
"$venv_py" -m pip install -q "$wheel"
log "added by the wheel: $(comm -13 "$scratch/before.txt" <("$venv_py" -m pip freeze) | tr '\n' ' ')"

# ---- 3. use it ------------------------------------------------------------------------------
fixture=$repo/build/fixtures/tiny_a_torchscript.pt2
if [ ! -f "$fixture" ]; then
  log "generating the tiny fixture (tools/make_fixtures.py)"
  fixture=$scratch/fixtures/tiny_a_torchscript.pt2
  "$py" tools/make_fixtures.py --out "$scratch/fixtures" --only tiny_a >/dev/null
fi
# Run from the scratch folder with a clean environment, so nothing of the repository or of
# .venv can be imported by accident.
run_clean() { (cd "$scratch" && env -u PYTHONPATH -u LD_LIBRARY_PATH "$@"); }
log "import, segment, and where the libraries came from"
run_clean "$venv_py" - "$fixture" "$repo/examples/astronaut.jpg" "$scratch/venv" <<'PY'
import os
import sys

fixture, photo, venv = sys.argv[1:]
venv = os.path.realpath(venv)
import sapiens_seg
from sapiens_seg import segmentation

assert os.path.realpath(sapiens_seg.__file__).startswith(venv + os.sep), sapiens_seg.__file__
model = segmentation.load(fixture, mode="portable", device="cpu")
result = model(photo)
assert result.labels.shape == (512, 512), result.labels.shape
assert len(result.classes) == 28 and result.backend.mode == "portable"
with open("/proc/self/maps") as f:
    loaded = {line.split()[-1] for line in f if line.rstrip().endswith(".so") or ".so." in line}
# LibTorch, ours, and the CUDA libraries libsapiens_seg links directly (from torch's nvidia-*).
names = ("libtorch", "libc10", "libsapiens_seg", "libcudart", "libcublas", "libcudnn", "libnvrtc")
ours = sorted(p for p in loaded if any(n in os.path.basename(p) for n in names))
assert any("libtorch_cpu" in p for p in ours), ours
strays = [p for p in ours if not os.path.realpath(p).startswith(venv + os.sep)]
assert not strays, f"loaded from outside the fresh venv: {strays}"
print(f"sapiens_seg {sapiens_seg.__version__}: {result.width}x{result.height}, "
      f"{int(result.foreground.sum())} foreground pixels, {result.backend}")
print("  " + "\n  ".join(ours))
PY
log "sapiens-seg --help (the venv's bin/)"
run_clean "$scratch/venv/bin/sapiens-seg" --help | head -n 3
run_clean "$scratch/venv/bin/sapiens-seg" segment "$repo/examples/astronaut.jpg" \
  -o "$scratch/out" --model "$fixture" --mode portable --device cpu --quiet
[ -s "$scratch/out/astronaut_seg.png" ] || fail "sapiens-seg segment wrote no label map"
log "passed in $(($(date +%s) - start)) s"
