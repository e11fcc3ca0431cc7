// What every fuzz target shares: a check that stops the run on a broken
// invariant (libFuzzer saves the input as a crash), and where ../shared is.
#pragma once

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "gguf/gguf_file.hpp"
#include "model/random_model.hpp"
#include "text/tokenizer.hpp"

// A fuzz target checks what must hold for every input, beyond "no crash": when it
// does not, the message says which invariant broke and abort() makes it a crash.
#define TROUPE_FUZZ_CHECK(condition, message)                                                 \
  do {                                                                                        \
    if (!(condition)) {                                                                       \
      std::fprintf(stderr, "%s:%d: invariant broken: %s (%s)\n", __FILE__, __LINE__, message, \
                   #condition);                                                               \
      std::abort();                                                                           \
    }                                                                                         \
  } while (false)

namespace troupe::fuzz {

// ../shared (or $TROUPE_SHARED_DIR): optional inputs that only a full checkout has.
inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("TROUPE_SHARED_DIR")) return env;
  return std::filesystem::path(TROUPE_SOURCE_DIR) / ".." / "shared";
}

// The built-in vocabulary of troupe's random models (SentencePiece, byte fallback),
// written once to a temporary GGUF and read back; aborts when that fails.
inline text::Tokenizer builtin_spm_tokenizer(std::int32_t vocab_size) {
  model::RandomModelSpec spec;
  spec.dim = 8;
  spec.num_layers = 1;
  spec.num_heads = 2;
  spec.num_kv_heads = 2;
  spec.ffn_dim = 16;
  spec.vocab_size = vocab_size;
  const auto path = std::filesystem::temp_directory_path() /
                    ("troupe-fuzz-vocab-" + std::to_string(::getpid()) + ".gguf");
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "fuzz setup: %s\n", what.c_str());
    std::abort();
  };
  if (auto written = model::write_random_model(spec, path.string()); !written) {
    fail(written.error().message);
  }
  auto file = gguf::GgufFile::open(path.string());
  if (!file) fail(file.error().message);
  auto tokenizer = text::Tokenizer::from_gguf(*file);
  std::filesystem::remove(path);
  if (!tokenizer) fail(tokenizer.error().message);
  return std::move(*tokenizer);
}

}  // namespace troupe::fuzz
