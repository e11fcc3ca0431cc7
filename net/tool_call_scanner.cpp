#include "net/tool_call_scanner.hpp"

#include "net/tool_calls.hpp"

namespace troupe::net {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

// The delta of call `index` at the end of `out` (consecutive pieces of one call merge).
ToolCallDelta& delta_for(std::vector<ToolCallDelta>& out, std::size_t index) {
  if (out.empty() || out.back().index != index) out.push_back(ToolCallDelta{index, {}, {}, {}});
  return out.back();
}

}  // namespace

ToolCallScanner::ToolCallScanner(std::string named_function) : named_(std::move(named_function)) {}

void ToolCallScanner::feed(std::string_view text, std::vector<ToolCallDelta>& out) {
  if (!named_.empty() && calls_.empty()) {
    // The output is the arguments: the call is known before its first byte.
    name_ = named_;
    key_ = "arguments";
    state_ = State::before_value;
    open_call(out);
  }
  for (const char c : text) step(c, out);
}

void ToolCallScanner::open_call(std::vector<ToolCallDelta>& out) {
  if (has_call_) return;
  has_call_ = true;
  calls_.push_back(Call{new_tool_call_id(), name_});
  ToolCallDelta& header = delta_for(out, calls_.size() - 1);
  header.id = calls_.back().id;
  header.name = name_;
  if (!pending_arguments_.empty()) {
    header.arguments = std::move(pending_arguments_);
    pending_arguments_.clear();
    calls_.back().arguments_begun = true;
  }
}

void ToolCallScanner::put_arguments(char c, std::vector<ToolCallDelta>& out) {
  if (!has_call_) {
    pending_arguments_ += c;
    return;
  }
  delta_for(out, calls_.size() - 1).arguments += c;
  calls_.back().arguments_begun = true;
}

void ToolCallScanner::end_object() {
  state_ = State::outside;
}

void ToolCallScanner::step(char c, std::vector<ToolCallDelta>& out) {
  switch (state_) {
    case State::outside:
      if (c == '{') {
        state_ = State::expect_key;
        name_.clear();
        pending_arguments_.clear();
        has_call_ = false;
        arguments_done_ = false;
      }
      return;
    case State::expect_key:
      if (c == '"') {
        key_.clear();
        escaped_ = false;
        state_ = State::in_key;
      } else if (c == '}') {
        end_object();
      }
      return;  // whitespace and ','
    case State::in_key:
      if (escaped_) {
        key_ += c;
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        state_ = State::after_key;
      } else {
        key_ += c;
      }
      return;
    case State::after_key:
      if (c == ':') state_ = State::before_value;
      return;
    case State::before_value:
      if (is_space(c)) return;
      in_string_ = false;
      escaped_ = false;
      depth_ = 0;
      if (key_ == "name" && c == '"' && !has_call_) {
        name_.clear();
        state_ = State::in_name;
        return;
      }
      if ((key_ == "arguments" || key_ == "parameters") && (c == '{' || c == '[') &&
          !arguments_done_) {
        state_ = State::in_arguments;
        depth_ = 1;
        put_arguments(c, out);
        return;
      }
      // Another key's value (or arguments given as a string: read whole at the end).
      state_ = State::skip_value;
      if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        depth_ = 1;
      }
      return;
    case State::in_name:
      if (escaped_) {
        name_ += c;
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        state_ = State::after_value;
        if (!name_.empty()) open_call(out);
      } else {
        name_ += c;
      }
      return;
    case State::in_arguments:
      if (in_string_) {
        put_arguments(c, out);
        if (escaped_) {
          escaped_ = false;
        } else if (c == '\\') {
          escaped_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
        return;
      }
      if (is_space(c)) return;
      put_arguments(c, out);
      if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if ((c == '}' || c == ']') && --depth_ == 0) {
        arguments_done_ = true;
        state_ = named_.empty() ? State::after_value : State::done;
      }
      return;
    case State::skip_value:
      if (in_string_) {
        if (escaped_) {
          escaped_ = false;
        } else if (c == '\\') {
          escaped_ = true;
        } else if (c == '"') {
          in_string_ = false;
          if (depth_ == 0) state_ = State::after_value;
        }
        return;
      }
      if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if (c == '}' || c == ']') {
        if (depth_ > 0) {
          if (--depth_ == 0) state_ = State::after_value;
        } else if (c == '}') {
          end_object();  // the object's end, after a number or a literal
        }
      } else if (c == ',' && depth_ == 0) {
        state_ = State::expect_key;
      }
      return;
    case State::after_value:
      if (c == ',') {
        state_ = State::expect_key;
      } else if (c == '}') {
        end_object();
      }
      return;
    case State::done:
      return;
  }
}

}  // namespace troupe::net
