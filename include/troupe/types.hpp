// The shared vocabulary of ids every room speaks.
#pragma once

#include <cstdint>

namespace troupe {

using TokenId = std::int32_t;
inline constexpr TokenId kNoToken = -1;

// How the KV cache stores keys and values (vLLM's --kv-cache-dtype). automatic: F16,
// which halves what a long context reads per token; F32 keeps them exact (CPU only).
enum class KvCacheType { automatic, f32, f16 };

}  // namespace troupe
