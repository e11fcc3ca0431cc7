#include "net/choice_text.hpp"

namespace troupe::net {

ChoiceText read_choice_text(const CompletionRequest& request, std::string_view text) {
  ChoiceText out;
  if (request.reasoning) {
    text::ReasoningSplit split = text::ReasoningParser(*request.reasoning).split(text);
    if (request.include_reasoning) out.reasoning = std::move(split.reasoning);
    out.content = std::move(split.content);
  } else {
    out.content = std::string(text);
  }
  // Calls are read from the answer alone: a call the model only thought about is none.
  if (request.chat && request.tools.reads_calls()) {
    ToolOutput read = read_tool_calls(request.tools, out.content);
    out.content = std::move(read.content);
    out.calls = std::move(read.calls);
  }
  return out;
}

ChoiceTextStream::ChoiceTextStream(const CompletionRequest& request)
    : reasoning_(request.reasoning), include_reasoning_(request.include_reasoning) {
  if (request.chat && request.tools.reads_calls()) tools_.emplace(request.tools);
}

ChoiceText ChoiceTextStream::take(std::string_view text, bool last) {
  ChoiceText out;
  if (reasoning_) {
    text::ReasoningSplit split = reasoning_->take(text, last);
    if (include_reasoning_) out.reasoning = std::move(split.reasoning);
    out.content = std::move(split.content);
  } else {
    out.content = std::string(text);
  }
  if (tools_) {
    ToolOutput shown = tools_->take(out.content, last);
    out.content = std::move(shown.content);
    out.calls = std::move(shown.calls);
    out.deltas = std::move(shown.deltas);
  }
  return out;
}

}  // namespace troupe::net
