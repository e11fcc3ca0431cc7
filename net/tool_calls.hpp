// Tool calling: a request's `tools` and `tool_choice`, and the model's output read back
// as calls. With tool_choice "required" or a named function, decoding is held to a valid
// call (vLLM's forms: a named function's output is its arguments; "required" gives a JSON
// array of {"name", "parameters"} objects). With "auto", the output is read in the model
// family's own format: Hermes/Qwen `<tool_call>{...}</tool_call>`, Llama 3.1's bare
// `{"name": ..., "parameters": ...}`, Mistral's `[TOOL_CALLS][{...}]`.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/api_error.hpp"
#include "net/tool_call_scanner.hpp"

namespace troupe::net {

enum class ToolCallFormat { hermes, llama3_json, mistral };

// The format a chat template's model writes its calls in (Hermes when it names none).
ToolCallFormat detect_tool_call_format(std::string_view chat_template);
std::string_view tool_call_format_name(ToolCallFormat format);
std::optional<ToolCallFormat> tool_call_format_named(std::string_view name);

// A new call's id: "call_" and 24 random hex digits.
std::string new_tool_call_id();

struct ToolCall {
  std::string id;  // "call_..." (made here when the model gave none)
  std::string name;
  std::string arguments;  // JSON text, as OpenAI sends it
};

// What a chat request asked of its tools.
struct ToolRequest {
  enum class Choice { none, automatic, required, named };
  Choice choice = Choice::none;  // none also when there are no tools
  std::string function;          // the named function
  ToolCallFormat format = ToolCallFormat::hermes;
  bool reads_calls() const { return choice != Choice::none; }
};

// Reads `tools`, `tool_choice` and `parallel_tool_calls`; for "required" or a named
// function, `grammar` is set to the GBNF of a valid call (a 400 when another constraint
// was given too, or a function's parameters do not compile).
tl::expected<ToolRequest, ApiError> parse_tool_request(const boost::json::object& body,
                                                       ToolCallFormat format, std::string& grammar);

// A function's parameters schema as a part of a larger one (tool_choice "required" holds
// every function's under one array): its own definitions move into `defs` as
// "<prefix><name>" and its local references ("#", "#/$defs/X", "#/definitions/X") follow
// them, so they still mean what they meant at the parameters' root.
boost::json::value hoist_definitions(const boost::json::value& parameters,
                                     const std::string& prefix, boost::json::object& defs);

// An output's text split into its content and its calls; calls that do not parse leave
// the whole text as content.
struct ToolOutput {
  std::string content;
  std::vector<ToolCall> calls;
  std::vector<ToolCallDelta> deltas;  // streamed: what the calls gained (ToolCallStream)
};
ToolOutput read_tool_calls(const ToolRequest& request, std::string_view text);

// A stream's text with the calls taken out: content goes out as it comes until a call may
// have begun; from there the calls go out as deltas as they are written (a call's id and
// name once its name is whole, then its arguments piece by piece, as vLLM streams them),
// and at the end the whole is read as calls (or sent as content after all). Over SSE and
// the WebSocket alike.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolRequest request)
      : request_(std::move(request)),
        scanner_(request_.choice == ToolRequest::Choice::named ? request_.function : "") {}
  // One event's text: the content that may go out now and the calls' deltas; at the
  // stream's end (`last`), also whatever was held, read (its content after this text's, the
  // calls whole, and the deltas that complete them).
  ToolOutput take(std::string_view text, bool last);

 private:
  // The part of `text` that may go out as content now.
  std::string feed(std::string_view text);

  ToolRequest request_;
  ToolCallScanner scanner_;
  std::size_t scanned_ = 0;  // the bytes of held_ the scanner has read (once a call began)
  std::string held_;         // text not yet sent
  bool in_call_ = false;     // a call has begun: everything from here waits
  bool sent_any_ = false;    // content went out: the output did not open with a call
};

// The tool_calls array of a message or a delta (`with_index`: the streamed form).
boost::json::array tool_calls_json(const std::vector<ToolCall>& calls, bool with_index);
// A chunk's delta.tool_calls: each call's index, its id, type and name on its first delta,
// and the piece of its arguments.
boost::json::array tool_call_deltas_json(const std::vector<ToolCallDelta>& deltas);

}  // namespace troupe::net
