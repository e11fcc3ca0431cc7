#!/usr/bin/env bash
# Gathers what the GPU machine lacks into .gpu-deps/ (git-ignored), to be carried
# there with the device tool: Catch2, Highway and tl::expected from this machine's
# Debian packages (headers, libraries, CMake files), and ../shared's stories260K
# for the forward test. The GPU machine has CUDA, cmake and ninja, none of these.
set -euo pipefail
cd "$(dirname "$0")/.."
deps=.gpu-deps
rm -rf "$deps"
mkdir -p "$deps/usr/include" "$deps/usr/lib/cmake" "$deps/usr/lib/x86_64-linux-gnu/cmake" \
         "$deps/shared/models"
cp -r /usr/include/catch2 /usr/include/hwy /usr/include/tl "$deps/usr/include/"
cp -r /usr/lib/cmake/Catch2 "$deps/usr/lib/cmake/"
cp /usr/lib/libCatch2WithMain.a "$deps/usr/lib/"
cp -r /usr/lib/x86_64-linux-gnu/cmake/hwy "$deps/usr/lib/x86_64-linux-gnu/cmake/"
cp -P /usr/lib/x86_64-linux-gnu/libhwy*.so* "$deps/usr/lib/x86_64-linux-gnu/"
if [ -f ../shared/models/stories260K.gguf ]; then
  cp ../shared/models/stories260K.gguf "$deps/shared/models/"
fi
du -sh "$deps"
