// An error for the client: its HTTP status and an OpenAI error object.
#pragma once

#include <string>

#include "troupe/result.hpp"

namespace troupe::net {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
};

}  // namespace troupe::net
