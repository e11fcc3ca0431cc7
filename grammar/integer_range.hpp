// Integer ranges as GBNF: the expression that matches exactly the decimal integers in
// [lo, hi] (no leading zeros, "-" before a negative one), digit position by digit position,
// as llama.cpp's json-schema-to-grammar builds them. JSON schemas' integer bounds use it
// (json_schema.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace troupe::grammar {

// An open side (nullopt) takes integers of up to 18 digits, as the JSON grammar's json-int.
std::string integer_range(std::optional<std::int64_t> lo, std::optional<std::int64_t> hi);

}  // namespace troupe::grammar
