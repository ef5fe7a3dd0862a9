#!/usr/bin/env bash
# Builds the video-reader fuzz target with clang's libFuzzer + AddressSanitizer + UBSan (the
# project's reader instrumented; FFmpeg's libavformat, libavcodec, libswscale, libavutil and
# OpenCV are the system's libraries, uninstrumented) and runs it for a bounded time on the seed
# corpus (tests/fuzz/corpus_videos: tiny videos of the containers and codecs phones and tools
# write, made by make_video_corpus.py, plus reproducers of past findings).
#   tests/fuzz/run_video.sh BUILD_DIR [SECONDS] [extra libFuzzer flags...]
set -euo pipefail
build=$1 seconds=${2:-20}
shift $(( $# >= 2 ? 2 : 1 ))
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$build/fuzz_video"
mkdir -p "$out/corpus"
cp "$root"/tests/fuzz/corpus_videos/* "$out/corpus/"
ffmpeg_libs="libavformat libavcodec libswscale libavutil"
# shellcheck disable=SC2046,SC2086
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/include" -I"$root/src" -I"$build/generated/include" \
  $(pkg-config --cflags $ffmpeg_libs opencv4) \
  "$root/tests/fuzz/fuzz_video.cpp" "$root/src/cli/video_reader.cpp" "$root/src/core/error.cpp" \
  $(pkg-config --libs $ffmpeg_libs) \
  $(pkg-config --libs-only-L opencv4) -lopencv_imgproc -lopencv_core -o "$out/fuzz_video"
# Crash reproducers land in the build folder; add them to tests/fuzz/corpus_videos once fixed.
# max_len: the seeds are under 16 KiB, and a few frames are all the reader's own paths need.
# rss_limit: a tiny header may declare a large frame, which FFmpeg allocates and the reader
# converts (up to its 2^28-pixel limit) before any check of the data behind it.
"$out/fuzz_video" -max_total_time="$seconds" -max_len=32768 -timeout=20 -rss_limit_mb=2048 \
  -artifact_prefix="$out/" "$@" "$out/corpus" 2>&1 | tail -n 5
