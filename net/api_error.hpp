// An error for the client: its HTTP status and an OpenAI error object.
#pragma once

#include <string>
#include <utility>

#include "troupe/result.hpp"

namespace troupe::net {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  // When to try again, in seconds, as the answer's Retry-After header (0: none): a server
  // that drains says so with its 503s.
  int retry_after_s = 0;
};

// A 400 about `param` (the request field at fault, when there is one).
inline ApiError bad_request(std::string message, std::string param = {}) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param)};
}

}  // namespace troupe::net
