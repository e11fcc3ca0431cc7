// The OpenAI request parsers on arbitrary bodies: /v1/completions, /v1/chat/completions
// (every chat family), /tokenize and /detokenize, with every parameter they read.
//
// Input: byte 0 picks the endpoint and the chat family, the rest is the body.
// Invariants (abort when broken):
//   - a refused body is a 4xx error with a message, and its error object is JSON;
//   - an accepted request has a non-empty prompt of vocabulary ids, max_tokens >= 1,
//     prompt + max_tokens within the context, n in [1, 16], stop ids in the vocabulary;
//   - the answers and stream chunks built for it are JSON;
//   - /tokenize and /detokenize answer JSON.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "api_fixture.hpp"

using namespace troupe;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t selector = data[0];
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  static constexpr text::ChatFamily kFamilies[] = {
      text::ChatFamily::chatml, text::ChatFamily::llama2, text::ChatFamily::llama3,
      text::ChatFamily::gemma};
  const auto& context = fuzz::api_context(kFamilies[(selector >> 2) % 4]);
  switch (selector % 4) {
    case 0:
    case 1: {
      auto parsed = selector % 4 == 0 ? net::parse_completion_request(body, context)
                                      : net::parse_chat_request(body, context);
      if (!parsed) {
        fuzz::check_client_error(parsed.error());
        return 0;
      }
      TROUPE_FUZZ_CHECK(parsed->chat == (selector % 4 == 1), "the endpoint decides chat");
      fuzz::check_request(*parsed, context);
      fuzz::check_answers(*parsed, context);
      return 0;
    }
    case 2: {
      auto answer = net::tokenize_response(body, context);
      if (!answer) {
        fuzz::check_client_error(answer.error());
      } else {
        fuzz::check_json(*answer, "/tokenize answers JSON");
      }
      return 0;
    }
    default: {
      auto answer = net::detokenize_response(body, context);
      if (!answer) {
        fuzz::check_client_error(answer.error());
      } else {
        fuzz::check_json(*answer, "/detokenize answers JSON");
      }
      return 0;
    }
  }
}
