// Small random-weight models written for a test, with the shape a test needs.
#pragma once

#include <functional>
#include <string>

#include "model/random_model.hpp"
#include "support/test_support.hpp"

namespace troupe::test {

// A 2-layer GQA model (dim 64, 4 heads, 2 KV heads, FFN 128, 512 tokens), as
// `adjust` changes it, written to a fresh temporary file. Returns its path.
inline std::string write_small_model(
    const std::string& name, const std::function<void(model::RandomModelSpec&)>& adjust = {}) {
  model::RandomModelSpec spec;
  spec.dim = 64;
  spec.num_layers = 2;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.ffn_dim = 128;
  spec.vocab_size = 512;
  spec.stddev = 0.1f;  // large enough that logits spread out
  if (adjust) adjust(spec);
  const std::string path = temp_path(name + ".gguf");
  const auto written = model::write_random_model(spec, path);
  if (!written) throw std::runtime_error(written.error().message);
  return path;
}

}  // namespace troupe::test
