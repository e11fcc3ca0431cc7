// A chat choice's output as its client is given it: the thinking apart (under
// --reasoning-parser), the answer, and the tool calls read from the answer. Whole, for
// the non-streamed answer, or event by event (SSE and the WebSocket).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/openai_api.hpp"
#include "net/tool_calls.hpp"
#include "text/reasoning_parser.hpp"

namespace troupe::net {

struct ChoiceText {
  std::string reasoning;  // reasoning_content (empty without a reasoning parser)
  std::string content;
  std::vector<ToolCall> calls;        // whole: the answer's, or at a stream's end
  std::vector<ToolCallDelta> deltas;  // streamed: what the calls gained
};

// One choice's whole output.
ChoiceText read_choice_text(const CompletionRequest& request, std::string_view text);

class ChoiceTextStream {
 public:
  explicit ChoiceTextStream(const CompletionRequest& request);
  // One event's text; `last`: the choice ends with it. What may go out now: thinking and
  // answer as they come, less what may still turn out a marker or a tool call (that waits,
  // until the end for a call).
  ChoiceText take(std::string_view text, bool last);
  // Whether the text is read at all (else every event's text goes out as it came).
  bool reads() const { return reasoning_.has_value() || tools_.has_value(); }

 private:
  std::optional<text::ReasoningParser> reasoning_;
  bool include_reasoning_ = true;
  std::optional<ToolCallStream> tools_;
};

}  // namespace troupe::net
