#!/usr/bin/env bash
# Builds the card-parser fuzz target with clang's libFuzzer + AddressSanitizer and runs it for a
# bounded time on the seed corpus (the bundled cards and a few malformed ones).
#   tests/fuzz/run.sh BUILD_DIR [SECONDS]
set -euo pipefail
build=$1 seconds=${2:-20}
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$build/fuzz"
mkdir -p "$out/corpus"
cp "$root"/cards/*.json "$root"/tests/fuzz/corpus_cards/* "$out/corpus/"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/include" -I"$root/src" -I"$build/generated/include" \
  "$root/tests/fuzz/fuzz_card.cpp" "$root/src/io/cards.cpp" "$root/src/io/paths.cpp" "$root/src/io/log.cpp" \
  "$root/src/core/error.cpp" "$root/src/core/settings.cpp" -ldl -o "$out/fuzz_card"
# Crash reproducers land in the build folder; add them to tests/fuzz/corpus_cards once fixed.
"$out/fuzz_card" -max_total_time="$seconds" -max_len=16384 -timeout=10 -artifact_prefix="$out/" \
  "$out/corpus" 2>&1 | tail -n 5
