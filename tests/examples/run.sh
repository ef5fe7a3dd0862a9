#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, builds examples/cpp against it with
# find_package(sapiens_seg), as an application would, and runs each example on a fixture
# checkpoint: one image, a folder in batches, a short video, and a camera that does not exist.
set -euo pipefail
build=$1 fixtures=$2 python=$3
repo=$(cd "$(dirname "$0")/../.." && pwd)
model=$fixtures/tiny_a_torchscript.pt2
# A fixed folder in the build tree (made anew each run), so that ccache sees the same paths
# every time and a second run does not compile the examples again.
tmp=$build/examples-test
rm -rf "$tmp"
mkdir -p "$tmp"
fail() { echo "install.examples: $*" >&2; exit 1; }
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

cmake --install "$build" --prefix "$tmp/install" >/dev/null
cmake -S "$repo/examples/cpp" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/install" "${launcher[@]}" >/dev/null
cmake --build "$tmp/build" >/dev/null
bin=$tmp/build

# The inputs: a folder of 5 images (one cropped to 300x200) and an unreadable file, and a short
# synthetic video (12 frames, 96x64).
mkdir "$tmp/photos"
for i in 1 2 3 4; do cp "$repo/examples/astronaut.jpg" "$tmp/photos/p$i.jpg"; done
printf 'not a png' >"$tmp/photos/broken.png"
"$python" - "$tmp" "$repo/examples/astronaut.jpg" <<'PY'
import sys, cv2, numpy as np
tmp, photo = sys.argv[1:]
cv2.imwrite(f"{tmp}/photos/p5.png", cv2.imread(photo)[:200, :300])
vw = cv2.VideoWriter(f"{tmp}/clip.mp4", cv2.VideoWriter_fourcc(*"mp4v"), 12, (96, 64))
for f in range(12):
    frame = np.full((64, 96, 3), 10 * f, np.uint8)
    cv2.rectangle(frame, (4 * f, 8), (4 * f + 24, 48), (0, 0, 255), -1)
    vw.write(frame)
vw.release()
PY

# 1. One image -> overlay PNG of the image's size.
out=$("$bin/segment_image" "$model" "$repo/examples/astronaut.jpg" "$tmp/overlay.png")
echo "$out"
grep -q "512x512" <<<"$out" || fail "segment_image did not report the image size"

# 2. The folder in batches of 2: broken.png is reported and skipped, the others written.
set +e
"$bin/segment_folder" "$model" "$tmp/photos" "$tmp/labels" 2 >"$tmp/folder.out" 2>"$tmp/folder.err"
status=$?
set -e
cat "$tmp/folder.out" "$tmp/folder.err"
[ "$status" = 1 ] || fail "segment_folder: exit status $status with a broken file, expected 1"
grep -q "6/6 images" "$tmp/folder.err" || fail "segment_folder printed no final progress line"
grep -q "skipped .*broken.png" "$tmp/folder.err" || fail "segment_folder did not report broken.png"
grep -q "^5 images segmented" "$tmp/folder.out" || fail "segment_folder summary line missing"
[ "$(ls "$tmp/labels" | wc -l)" = 5 ] || fail "segment_folder did not write 5 label maps"

# 3. The video, with its overlay video written; then only its first 5 frames.
out=$("$bin/segment_video" "$model" "$tmp/clip.mp4" --out "$tmp/clip_overlay.mp4")
echo "$out"
grep -Eq "^12 frames in [0-9.]+ s: [0-9.]+ frames/s" <<<"$out" || fail "segment_video: no frames/s line"
out=$("$bin/segment_video" "$model" "$tmp/clip.mp4" --max-frames 5)
grep -q "^5 frames in" <<<"$out" || fail "segment_video --max-frames 5 ran $out"

# 4. A camera index that does not exist: a clear error, no crash.
set +e
"$bin/segment_video" "$model" 63 >"$tmp/cam.out" 2>"$tmp/cam.err"
status=$?
set -e
[ "$status" = 1 ] || fail "segment_video on a missing camera: exit status $status, expected 1"
grep -q "error: cannot open camera 63" "$tmp/cam.err" || fail "segment_video: $(cat "$tmp/cam.err")"

# What the programs wrote, looked at.
"$python" - "$tmp" "$repo/examples/astronaut.jpg" <<'PY'
import sys, cv2
tmp, photo = sys.argv[1:]
overlay, original = cv2.imread(f"{tmp}/overlay.png"), cv2.imread(photo)
assert overlay is not None and overlay.shape == original.shape, "segment_image: not a PNG of the photo's size"
assert (overlay != original).any(), "segment_image: the overlay is the photo unchanged"
assert cv2.imread(f"{tmp}/labels/p5_seg.png", cv2.IMREAD_UNCHANGED).shape == (200, 300)
cap, n = cv2.VideoCapture(f"{tmp}/clip_overlay.mp4"), 0
while cap.read()[0]:
    n += 1
assert n == 12, f"segment_video --out wrote {n} frames"
PY
rm -rf "$tmp"
echo "install.examples: all examples built against the install tree and passed"
