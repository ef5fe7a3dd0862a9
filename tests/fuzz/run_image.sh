#!/usr/bin/env bash
# Builds the image-input fuzz target with clang's libFuzzer + AddressSanitizer + UBSan (the
# project's decoding code instrumented; OpenCV, libjpeg, libpng, libtiff, libwebp and stb_image
# are the system's libraries) and runs it for a bounded time on the seed corpus
# (tests/fuzz/corpus_images: small real images of every accepted format, made by
# make_image_corpus.py, plus reproducers of past findings).
#   tests/fuzz/run_image.sh BUILD_DIR [SECONDS] [extra libFuzzer flags...]
set -euo pipefail
build=$1 seconds=${2:-20}
shift $(( $# >= 2 ? 2 : 1 ))
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$build/fuzz_image"
mkdir -p "$out/corpus"
cp "$root"/tests/fuzz/corpus_images/* "$out/corpus/"
# shellcheck disable=SC2046
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/include" -I"$root/src" -I"$build/generated/include" -I/usr/include/stb \
  $(pkg-config --cflags opencv4) \
  "$root/tests/fuzz/fuzz_image.cpp" "$root/src/io/image.cpp" "$root/src/io/image_header.cpp" \
  "$root/src/io/log.cpp" "$root/src/io/paths.cpp" "$root/src/core/error.cpp" \
  "$root/src/core/settings.cpp" \
  "$root/src/core/checkpoint/mapped_file.cpp" \
  $(pkg-config --libs-only-L opencv4) -lopencv_imgcodecs -lopencv_imgproc -lopencv_core \
  -ljpeg -lpng16 -ltiff -lwebp -lstb -o "$out/fuzz_image"
# Crash reproducers land in the build folder; add them to tests/fuzz/corpus_images once fixed.
# rss_limit: a decode may legitimately take a few hundred MB (the limit is 1 MP here, but a
# progressive JPEG's coefficients and OpenCV's buffers add up).
"$out/fuzz_image" -max_total_time="$seconds" -max_len=65536 -timeout=20 -rss_limit_mb=2048 \
  -artifact_prefix="$out/" "$@" "$out/corpus" 2>&1 | tail -n 5
