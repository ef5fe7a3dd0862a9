#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, builds tests/consumer against it with
# find_package(sapiens_seg) and runs it on a fixture checkpoint.
set -euo pipefail
build=$1 fixtures=$2 source=$(cd "$(dirname "$0")" && pwd)
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix/install" >/dev/null
cmake -S "$source" -B "$prefix/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix/install" >/dev/null
cmake --build "$prefix/build" >/dev/null
out=$("$prefix/build/consumer" "$fixtures/tiny_a_torchscript.pt2" "$source/../../examples/astronaut.jpg")
echo "$out"
grep -q "512x512" <<<"$out"
