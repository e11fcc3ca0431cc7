// The shared vocabulary of ids every room speaks.
#pragma once

#include <cstdint>

namespace troupe {

using TokenId = std::int32_t;
inline constexpr TokenId kNoToken = -1;

}  // namespace troupe
