// OpenAI's Responses API (POST /v1/responses), as vLLM serves it: stateless. A request's
// `instructions` and `input` (a text, or message, function_call and function_call_output
// items), its function `tools`, `tool_choice`, `text.format` and `max_output_tokens` become
// a chat request; the answer is a response object whose `output` holds reasoning, message
// and function_call items, streamed as its typed events (response.created, ...,
// response.output_text.delta, ..., response.completed). Nothing is stored: a
// previous_response_id is a 404, as vLLM's without its store.
#pragma once

#include <boost/json/object.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "net/choice_text.hpp"
#include "net/openai_api.hpp"

namespace troupe::net {

// The chat request a Responses body asks for; its `responses_fields` is set.
tl::expected<CompletionRequest, ApiError> parse_responses_request(std::string_view body,
                                                                  const ApiContext& context);

// The ids of a response's output items, shared by its stream and its last object.
struct ResponseItemIds {
  std::string reasoning;                    // rs_...
  std::string message;                      // msg_...
  std::vector<std::string> function_calls;  // fc_..., one per call
};

// The response object of a finished request: its output read from `output.text`.
std::string responses_response(const ApiContext& context, const std::string& id,
                               std::int64_t created, const CompletionRequest& request,
                               const CompletionOutput& output);

// A streamed response: each engine event of its one sequence in, its SSE events out.
class ResponsesStream {
 public:
  ResponsesStream(const ApiContext& context, std::string id, std::int64_t created,
                  const CompletionRequest& request);
  // response.created and response.in_progress.
  std::string start();
  // What this event adds (output items opened, deltas, and at the end the items done and
  // response.completed, or response.incomplete when max_output_tokens cut it).
  std::string take(const TokenEvent& event);

 private:
  enum class Open { none, reasoning, message, function_call };
  std::string event(std::string_view type, boost::json::object fields);
  std::string close_item();
  boost::json::object response_object(std::string_view status, const TokenEvent* end) const;

  const ApiContext& context_;
  std::string id_;
  std::int64_t created_;
  const CompletionRequest& request_;
  ChoiceTextStream reads_;
  ChoiceText so_far_;  // everything sent: the last object's output
  ResponseItemIds ids_;
  Open open_ = Open::none;
  int output_index_ = -1;
  std::vector<int> call_output_index_;
  int sequence_ = 0;
};

}  // namespace troupe::net
