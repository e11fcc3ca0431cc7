// The WebSocket's messages (/v1/ws, docs/websocket.md) on arbitrary text: generate
// (completion or chat, decided on the parsed object) and cancel.
//
// Invariants (abort when broken):
//   - a refused message is a 4xx error whose frame is JSON, and it names the
//     message's id whenever the message was an object with a string id short enough to
//     be echoed (net::kMostSocketIdBytes; a longer one is refused naming "id", unechoed);
//   - an accepted message has a non-empty id and a known type; a generate's request
//     holds what the parsers promise the engine (see api_fixture.hpp), is a chat
//     exactly when the object has "messages", and its frames are JSON.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "api_fixture.hpp"

using namespace troupe;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto& context = fuzz::api_context();
  auto message = net::parse_websocket_message(text, context);
  boost::json::error_code ec;
  const boost::json::value parsed = boost::json::parse(text, ec);
  const auto* object = !ec && parsed.is_object() ? &parsed.as_object() : nullptr;
  if (!message) {
    fuzz::check_client_error(message.error().error);
    fuzz::check_json(net::websocket_error(message.error().id, message.error().error),
                     "error frames are JSON");
    if (object != nullptr) {
      const auto* id = object->if_contains("id");
      if (id != nullptr && id->is_string() && id->get_string().size() <= net::kMostSocketIdBytes) {
        TROUPE_FUZZ_CHECK(message.error().id == std::string_view(id->get_string()),
                          "an error names the message's id");
      } else if (id != nullptr && id->is_string()) {
        TROUPE_FUZZ_CHECK(message.error().id.empty(), "an id too long to echo is not echoed");
      }
    }
    return 0;
  }
  TROUPE_FUZZ_CHECK(object != nullptr, "only a JSON object is a message");
  TROUPE_FUZZ_CHECK(!message->id.empty(), "a message has an id");
  TROUPE_FUZZ_CHECK(message->type == "generate" || message->type == "cancel", "a known type");
  if (message->type == "generate") {
    TROUPE_FUZZ_CHECK(message->request.chat == object->contains("messages"),
                      "a generate is a chat exactly when it has messages");
    fuzz::check_request(message->request, context);
    fuzz::check_answers(message->request, context);
  }
  return 0;
}
