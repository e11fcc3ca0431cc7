// The shared vocabulary of ids and kinds every room speaks.
#pragma once

#include <cstdint>

namespace troupe {

using TokenId = std::int32_t;
inline constexpr TokenId kNoToken = -1;

using RequestId = std::uint64_t;

// Where a model runs. The underlying type is fixed: a worker's spec carries it over the wire.
enum class Device : std::int32_t { cpu, cuda };

// How the KV cache stores keys and values (vLLM's --kv-cache-dtype). F16 halves the bytes a
// long context reads per token (llama.cpp's default too); F32 keeps them exact (CPU only).
// A configuration leaves it unset (std::nullopt) for the device's default: F16.
enum class KvCacheDtype : std::uint8_t { f32, f16 };

}  // namespace troupe
