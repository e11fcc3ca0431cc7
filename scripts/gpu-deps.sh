#!/usr/bin/env bash
# Gathers what the GPU machine lacks into .gpu-deps/ (git-ignored), to be carried
# there with the device tool: Catch2, Highway and tl::expected from this machine's
# Debian packages (headers, libraries, CMake files), and from ../shared stories260K and
# the architecture models for the forward tests and three vocabularies for the
# tokenizer's. The GPU machine has CUDA, cmake and ninja, none of these.
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
# The three real vocabularies the tokenizer round-trip test reads (0.7-1.8 MB each): the
# GPU-only build runs that test too, and there a missing file is a failure, not a skip.
if [ -d ../shared/vocab ]; then
  mkdir -p "$deps/shared/vocab"
  cp ../shared/vocab/ggml-vocab-llama-spm.gguf ../shared/vocab/ggml-vocab-gpt-2.gguf \
     ../shared/vocab/ggml-vocab-deepseek-coder.gguf "$deps/shared/vocab/"
fi
# The architectures' reference models (3-6 MB each) for the GPU forward and LoRA tests.
if [ -d ../shared/models/archs ]; then
  mkdir -p "$deps/shared/models/archs"
  cp ../shared/models/archs/qwen2.gguf ../shared/models/archs/phi3.gguf \
     ../shared/models/archs/gemma2.gguf ../shared/models/archs/llama.gguf \
     "$deps/shared/models/archs/"
fi
# The reference LoRA adapters (30-600 KB) for the GPU's LoRA test.
if [ -d ../shared/models/lora ]; then
  mkdir -p "$deps/shared/models/lora"
  cp ../shared/models/lora/*.gguf "$deps/shared/models/lora/"
fi
du -sh "$deps"
