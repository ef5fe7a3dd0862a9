#!/usr/bin/env bash
# Builds the safetensors header fuzz target with clang's libFuzzer + AddressSanitizer + UBSan and
# runs it for a bounded time on the seed corpus (tiny valid files and malformed ones).
#   tests/fuzz/run_safetensors.sh BUILD_DIR [SECONDS]
set -euo pipefail
build=$1 seconds=${2:-20}
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$build/fuzz_safetensors"
mkdir -p "$out/corpus"
cp "$root"/tests/fuzz/corpus_safetensors/* "$out/corpus/"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/include" -I"$root/src" -I"$build/generated/include" \
  "$root/tests/fuzz/fuzz_safetensors.cpp" "$root/src/core/checkpoint/safetensors_header.cpp" \
  "$root/src/core/error.cpp" -o "$out/fuzz_safetensors"
# Crash reproducers land in the build folder; add them to tests/fuzz/corpus_safetensors once fixed.
"$out/fuzz_safetensors" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
  -artifact_prefix="$out/" "$out/corpus" 2>&1 | tail -n 5
