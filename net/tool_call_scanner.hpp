// Tool calls read as their text is generated, for streaming them as vLLM and OpenAI do:
// each call's id and name once its name is whole, then its arguments piece by piece.
// Whatever the family's wrapping (Hermes' <tool_call> tags, Mistral's and "required"'s
// array, Llama 3.1's bare objects), a call is a JSON object with "name" and "arguments"
// (or "parameters"); text between the objects is the wrapping and is skipped.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::net {

// One piece of a streamed call (delta.tool_calls[i] of a chunk).
struct ToolCallDelta {
  std::size_t index = 0;
  std::string id;  // the call's first delta only, with its name
  std::string name;
  std::string arguments;  // the next piece of the arguments' JSON
};

class ToolCallScanner {
 public:
  // `named_function`: the output is that function's arguments object itself (tool_choice
  // naming a function); empty: the output holds call objects.
  explicit ToolCallScanner(std::string named_function = {});

  // Appends what `text` adds to the calls: a call's header once its name is read, and
  // the arguments as they come, without the whitespace between JSON tokens (the text
  // json::serialize gives for ordinary JSON). Arguments written before the name wait
  // for it.
  void feed(std::string_view text, std::vector<ToolCallDelta>& out);

  struct Call {
    std::string id;
    std::string name;
    bool arguments_begun = false;  // some of the arguments went out
  };
  // The calls whose header went out, in order.
  const std::vector<Call>& calls() const { return calls_; }

 private:
  enum class State {
    outside,       // between call objects: waiting for '{'
    expect_key,    // in a call object, before a key (or its end)
    in_key,        // inside a key's string
    after_key,     // before ':'
    before_value,  // after ':'
    in_name,       // inside "name"'s string
    in_arguments,  // inside the arguments' object or array
    skip_value,    // inside a value of another key
    after_value,   // before ',' or '}'
    done,          // a named function's arguments were read whole: the rest is nothing
  };

  void step(char c, std::vector<ToolCallDelta>& out);
  // The current object's call: its header out now that its name is known.
  void open_call(std::vector<ToolCallDelta>& out);
  void put_arguments(char c, std::vector<ToolCallDelta>& out);
  void end_object();

  std::string named_;
  State state_ = State::outside;
  std::string key_;
  std::string name_;
  std::string pending_arguments_;  // written before the name
  bool has_call_ = false;          // the current object's header went out
  bool arguments_done_ = false;    // the current object's arguments were read whole
  // JSON nesting inside a value being copied or skipped, and its strings.
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
  std::vector<Call> calls_;
};

}  // namespace troupe::net
