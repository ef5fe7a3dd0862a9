#!/usr/bin/env bash
# Builds the TorchScript archive fuzz target (zip directory, records, data.pkl unpickler; no
# LibTorch) with clang's libFuzzer + AddressSanitizer + UBSan and runs it for a bounded time on
# the seed corpus (archives written by torch in several styles, and damaged ones; see
# tests/fuzz/README.md).
#   tests/fuzz/run_torchscript.sh BUILD_DIR [SECONDS] [extra libFuzzer flags...]
set -euo pipefail
build=$1 seconds=${2:-20}
shift $(( $# < 2 ? $# : 2 ))
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$build/fuzz_torchscript"
mkdir -p "$out/corpus"
cp "$root"/tests/fuzz/corpus_torchscript/* "$out/corpus/"
isal=()
if [ -f /usr/include/isa-l/crc.h ]; then isal=(-DSAPIENS_SEG_HAVE_ISAL -lisal); fi
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/include" -I"$root/src" -I"$build/generated/include" \
  "$root/tests/fuzz/fuzz_torchscript.cpp" "$root/src/core/checkpoint/torchscript_format.cpp" \
  "$root/src/core/checkpoint/zip_codec.cpp" "$root/src/core/error.cpp" -lz "${isal[@]}" \
  -o "$out/fuzz_torchscript"
# Crash reproducers land in the build folder; add them to tests/fuzz/corpus_torchscript once fixed.
"$out/fuzz_torchscript" -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$out/" "$@" "$out/corpus" 2>&1 | tail -n 5
