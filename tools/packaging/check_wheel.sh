#!/usr/bin/env bash
# Does the repaired wheel (tools/packaging/build_wheel.sh) install and work on a machine that has
# none of the build machine's libraries? In a minimal Debian root file system (debootstrap
# --variant=minbase, plus python3 and python3-venv: no -dev package, no OpenCV, no libcurl),
# entered with chroot: a venv with the wheel and the pinned torch (pip --no-index from a folder
# of wheels downloaded once here), then tools/packaging/check_wheel_chroot.py segments
# examples/astronaut.jpg with the tiny fixture from Python and with the sapiens-seg CLI, segments
# four short videos (H.264/MP4, MPEG-4 Part 2/AVI, VP9/WebM, AV1/Matroska) into H.264 overlay
# videos, downloads a model through the loopback stand-in for the Hub (tests/python/hub_server.py)
# from Python and from the CLI, and over HTTPS from a loopback server whose certificate is made
# for the run (refused, then accepted with SSL_CERT_FILE), and checks with ldd and
# /proc/PID/maps that every shared library came from the venv or from a Debian package of that
# root, and the vendored ones from the wheel.
# Back here, ffprobe checks the overlay videos. The run is recorded in
# benchmarks/results/wheel-check.json.
#
#   tools/packaging/check_wheel.sh [--wheel FILE] [--dist bookworm|trixie] [--keep] [--no-record]
#
#   --wheel FILE  the wheel to check (default: build one with tools/packaging/build_wheel.sh)
#   --dist NAME   the Debian release of the root (default bookworm, whose python3 is 3.11; trixie
#                 has 3.13 and needs a cp313 wheel: tools/packaging/build_wheel.sh
#                 --python python3.13)
#   --keep        leave the scratch folder (root file system, outputs) behind
#
# Needs root (debootstrap, mount, chroot), Debian's debootstrap (installed when missing) and
# ffmpeg (tools/setup.sh). The roots are made once and kept as tarballs in build-wheel-deps/roots/,
# the torch wheels in build-wheel-deps/wheelhouse/ (about 3 GB per Python version).
#
# Not part of ctest or .ci/run: too slow, and it needs root. With the wheel already built, a run
# took about 4 minutes on the 2-core build machine (the times are in wheel-check.json), then a
# minute or two to delete the root; installing torch and its CUDA packages into the root is the
# largest part. Building the wheel first (tools/packaging/build_wheel.sh)
# adds about 25 minutes for the trimmed libraries the first time, and the project's build.
set -Eeuo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
keep=0 record=1 wheel="" dist=bookworm
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel=$(realpath "$2"); shift ;;
    --dist) dist=$2; shift ;;
    --keep) keep=1 ;;
    --no-record) record=0 ;;
    *) echo "check_wheel.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
case "$dist" in
  bookworm | trixie) ;;
  *) echo "check_wheel.sh: --dist bookworm|trixie" >&2; exit 2 ;;
esac

start=$(date +%s)
log() { printf '[check_wheel %4ds] %s\n' "$(($(date +%s) - start))" "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }
trap 'log "FAILED: line $LINENO: $BASH_COMMAND"' ERR

[ "$(id -u)" = 0 ] || fail "needs root (debootstrap, mount, chroot)"
command -v debootstrap >/dev/null || "$repo/tools/apt_install.sh" debootstrap
for t in debootstrap ffmpeg ffprobe openssl; do
  command -v "$t" >/dev/null || fail "$t not found (tools/setup.sh installs ffmpeg)"
done
py=$repo/.venv/bin/python
[ -x "$py" ] || fail "no .venv: run tools/setup.sh first"
torch_pin=$(sed -n 's/.*"torch==\([0-9.]*\)".*/\1/p' pyproject.toml | head -n1)
deps=$repo/build-wheel-deps
mkdir -p "$deps/roots" "$deps/wheelhouse"

# ---- scratch folder, mounts, and their removal on every exit -------------------------------
scratch=$(mktemp -d "${TMPDIR:-/tmp}/sapiens-seg-wheel.XXXXXX")
root=$scratch/root
mounts=()
cleanup() {
  local rc=$? m i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    m=${mounts[i]}
    mountpoint -q "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }
  done
  if grep -q " $scratch/" /proc/mounts; then
    log "still mounted under $scratch, left in place:"; grep " $scratch/" /proc/mounts >&2
  elif [ "$keep" = 0 ]; then
    rm -rf --one-file-system "$scratch"
  else
    log "kept: $scratch"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bind() {  # bind SRC DST [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounts+=("$2")
  [ "${3:-}" != ro ] || mount -o remount,bind,ro "$2"
}

# ---- 1. the wheel ----------------------------------------------------------------------------
if [ -z "$wheel" ]; then
  log "building the repaired wheel (tools/packaging/build_wheel.sh)"
  tools/packaging/build_wheel.sh -o "$scratch/dist"
  wheel=$(ls "$scratch"/dist/sapiens_seg-*.whl)
fi
[ -f "$wheel" ] || fail "no wheel $wheel"
wheel_name=$(basename "$wheel")
log "wheel: $wheel_name ($(du -h "$wheel" | cut -f1))"
# The binaries look for libraries only in $ORIGIN-relative folders (the wheel's own, torch's).
mkdir "$scratch/unpacked"
"$py" -m zipfile -e "$wheel" "$scratch/unpacked"
while IFS= read -r -d '' elf; do
  runpath=$(readelf -d "$elf" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
  IFS=: read -ra entries <<<"$runpath"
  for e in "${entries[@]}"; do
    case "$e" in
      '$ORIGIN'*) ;;
      *) fail "${elf#"$scratch/unpacked/"} looks for libraries in $e (a build machine's path)" ;;
    esac
  done
done < <(find "$scratch/unpacked" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0)

# ---- 2. the root file system (made once, unpacked fresh for every run) ----------------------
tarball=$deps/roots/$dist.tar
if [ ! -f "$tarball" ]; then
  mirror=$(apt-get indextargets --format '$(REPO_URI)' 2>/dev/null |
           awk '/debian\/?$/ && !n++' | grep . ||
           echo http://deb.debian.org/debian/)
  log "debootstrap --variant=minbase --include=python3,python3-venv $dist ($mirror)"
  debootstrap --variant=minbase --include=python3,python3-venv "$dist" "$scratch/boot" "$mirror" \
    >"$scratch/debootstrap.log" 2>&1 ||
    { tail -n 20 "$scratch/debootstrap.log" >&2; fail debootstrap; }
  tar -C "$scratch/boot" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
  rm -rf --one-file-system "$scratch/boot"
fi
mkdir "$root"
tar -C "$root" -xpf "$tarball"
bind /proc "$root/proc"
bind /dev "$root/dev"
in_root() {
  chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"
}
dist_py=$(in_root python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
cp_tag=cp${dist_py/./}
case "$wheel_name" in
  *-"$cp_tag"-"$cp_tag"-*) ;;
  *) fail "$dist's python3 is $dist_py: it needs a $cp_tag wheel, not $wheel_name" \
       "(tools/packaging/build_wheel.sh --python python$dist_py)" ;;
esac
dev=$(in_root dpkg-query -W -f '${Package}\n' | grep -E -- '-dev$|opencv|curl|libav' || true)
[ -z "$dev" ] || fail "the root holds $dev"

# ---- 3. torch and its dependencies, downloaded once for this Python --------------------------
glibc=$(in_root ldd --version | sed -n '1s/.* \([0-9]*\.[0-9]*\)$/\1/p')
house=$deps/wheelhouse/$cp_tag
if ! ls "$house"/torch-"$torch_pin"-*.whl >/dev/null 2>&1; then
  log "downloading torch==$torch_pin and the wheel's other requirements for $cp_tag"
  # pip takes the platform tags literally: every manylinux tag this glibc satisfies.
  plats=()
  for ((v = ${glibc#*.}; v >= 17; v--)); do plats+=(--platform "manylinux_2_${v}_x86_64"); done
  "$py" -m pip download -q -d "$house" --only-binary=:all: --python-version "$dist_py" \
    "${plats[@]}" --platform manylinux2014_x86_64 "torch==$torch_pin" "numpy>=1.22" "tqdm>=4.66"
fi

# ---- 4. what the check uses ------------------------------------------------------------------
work=$root/check
mkdir -p "$work/videos" "$work/fixtures"
cp "$wheel" "$work/"
cp examples/astronaut.jpg tests/python/hub_server.py tools/packaging/check_wheel_chroot.py "$work/"
# The release build's fixtures, else a copy made once for this check.
fixtures=$repo/build/fixtures
have_fixtures() { [ -f "$1/tiny_b_torchscript.pt2" ] && [ -f "$1/cards/tiny_b.json" ]; }
if ! have_fixtures "$fixtures"; then
  fixtures=$deps/fixtures
  if ! have_fixtures "$fixtures"; then
    log "making the tiny fixtures (tests/fixtures/make_fixtures.py)"
    "$py" tests/fixtures/make_fixtures.py --out "$fixtures" --only tiny_a tiny_b >/dev/null
  fi
fi
cp "$fixtures"/tiny_{a,b}_torchscript.pt2 "$work/fixtures/"
mkdir "$work/fixtures/cards" && cp "$fixtures"/cards/tiny_{a,b}.json "$work/fixtures/cards/"
# A certificate for the loopback HTTPS server (the vendored libcurl must verify against it).
mkdir "$work/tls"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$work/tls/key.pem" -out "$work/tls/cert.pem" \
  2>/dev/null || fail "openssl req"
# Short clips of the photo panned across, in the containers and codecs people's videos come in;
# made by Debian's ffmpeg here (the root has none).
pan=(-loop 1 -framerate 10 -i examples/astronaut.jpg -vf "scale=256:256,crop=160:120:x='8*n':y=60"
     -frames:v 8 -pix_fmt yuv420p)
ffmpeg -v error "${pan[@]}" -c:v libx264 "$work/videos/clip_h264.mp4"
ffmpeg -v error "${pan[@]}" -c:v mpeg4 "$work/videos/clip_mpeg4.avi"
ffmpeg -v error "${pan[@]}" -c:v libvpx-vp9 -b:v 300k "$work/videos/clip_vp9.webm"
ffmpeg -v error "${pan[@]}" -c:v libaom-av1 -cpu-used 8 -b:v 300k "$work/videos/clip_av1.mkv"

# ---- 5. install and run in the root ----------------------------------------------------------
bind "$house" "$root/wheelhouse" ro
log "$dist root: python $dist_py, glibc $glibc; pip install $wheel_name --no-index"
t_install=$(date +%s)
in_root python3 -m venv /opt/venv
in_root /opt/venv/bin/pip install -q --no-index --find-links /wheelhouse "/check/$wheel_name" ||
  fail "pip install in the $dist root"
install_s=$(($(date +%s) - t_install))
log "installed in ${install_s} s; running tools/packaging/check_wheel_chroot.py there"
in_root /opt/venv/bin/python /check/check_wheel_chroot.py /check ||
  fail "the checks in the $dist root"
for m in "$root/wheelhouse" "$root/dev" "$root/proc"; do umount "$m"; done

# ---- 6. the overlay videos, probed here --------------------------------------------------------
probes=$scratch/probes.json
echo '{}' >"$probes"
for v in "$work"/out/*_overlay.mp4; do
  ffprobe -v error -select_streams v:0 -count_frames -show_entries \
    stream=codec_name,codec_tag_string,pix_fmt,width,height,nb_read_frames -of json "$v" |
    "$py" -c 'import json,sys; p=json.load(open(sys.argv[1])); s=json.load(sys.stdin)["streams"][0]
assert (s["codec_name"], s["codec_tag_string"], s["pix_fmt"]) == ("h264", "avc1", "yuv420p"), s
assert int(s["nb_read_frames"]) == 8, s
p[sys.argv[2]] = s; json.dump(p, open(sys.argv[1], "w"))' "$probes" "$(basename "$v")" ||
    fail "$(basename "$v") is not the H.264 overlay expected"
done
log "overlay videos: H.264 (avc1, yuv420p), 8 frames each"

# ---- 7. the record ---------------------------------------------------------------------------
elapsed=$(($(date +%s) - start))
if [ "$record" = 1 ]; then
  "$py" - "$repo/benchmarks/results/wheel-check.json" "$wheel" "$work/result.json" "$probes" \
    "$dist" "$glibc" "$install_s" "$elapsed" "$(in_root dpkg-query -W -f '${Package}\n' | wc -l)" \
    "$(. "$root/etc/os-release" && echo "$PRETTY_NAME")" <<'PY'
import json, os, sys, time, zipfile
from pathlib import Path

sys.path.insert(0, str(Path(sys.argv[1]).parents[1]))  # benchmarks/
from machine_facts import machine_facts

facts = machine_facts()

out, wheel, result, probes, dist, glibc, install_s, elapsed, npkg, pretty = sys.argv[1:]
rec = json.loads(Path(out).read_text()) if Path(out).exists() else {}
with zipfile.ZipFile(wheel) as z:
    infos = z.infolist()
    tag = z.read(next(i for i in infos if i.filename.endswith(".dist-info/WHEEL"))).decode()
libs = sorted((i for i in infos if i.filename.startswith("sapiens_seg.libs/") and not i.is_dir()),
              key=lambda i: -i.file_size)
ours = [i for i in infos if i.filename.startswith("sapiens_seg/") and
        (".so" in i.filename or "/bin/" in i.filename)]
r = json.loads(Path(result).read_text())
name = os.path.basename(wheel)
rec.setdefault("wheels", {})[name] = {
    "tag": [l.split(": ", 1)[1] for l in tag.splitlines() if l.startswith("Tag: ")],
    "bytes": os.path.getsize(wheel),
    "unpacked_bytes": sum(i.file_size for i in infos),
    "own_binaries": {i.filename: i.file_size for i in ours},
    "vendored_bytes": sum(i.file_size for i in libs),
    "vendored": [{"file": i.filename.split("/", 1)[1], "bytes": i.file_size,
                  "zipped_bytes": i.compress_size} for i in libs],
}
rec.setdefault("chroots", {})[dist] = {
    "root": f"debootstrap --variant=minbase --include=python3,python3-venv {dist}",
    "os": pretty, "glibc": glibc, "debian_packages": int(npkg), "python": r["python"],
    "wheel": name, "torch": r["torch"], "sapiens_seg": r["sapiens_seg"],
    "pip_install_seconds": int(install_s), "checks_seconds": r["seconds"],
    "steps": r["steps"], "overlay_videos": json.loads(Path(probes).read_text()),
    "libraries": {"python_process": r["maps_python"], "cli_process": r["maps_cli"],
                  "ldd": r["ldd"]},
    "segmented": r["segmented"], "date": time.strftime("%Y-%m-%d", time.gmtime()),
    "run_seconds": int(elapsed),
    # The machine the check ran on, by CPU vendor, family, model and stepping.
    "machine": {k: facts[k] for k in ("cpu", "cores", "memory_gib", "os")},
}
rec["segmented"] = all(c["segmented"] for c in rec["chroots"].values())
rec["note"] = ("tools/packaging/check_wheel.sh on a shared 2-core build machine: durations are "
               "indicative")
Path(out).write_text(json.dumps(rec, indent=2) + "\n")
PY
  log "recorded in benchmarks/results/wheel-check.json"
fi
log "passed in $elapsed s"
