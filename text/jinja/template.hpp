// A Jinja template parsed once and rendered many times: the subset of jinja2 that
// chat templates use, set up as Hugging Face transformers sets it up
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loop controls, its
// tojson, raise_exception and strftime_now). Errors are values that say where.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "text/jinja/ast.hpp"
#include "text/jinja/value.hpp"
#include "troupe/result.hpp"

namespace troupe::text::jinja {

struct RenderOptions {
  // A render that prints more, or runs more statements and loop turns, fails instead.
  std::size_t max_output_bytes = std::size_t{8} << 20;
  std::int64_t max_steps = 2'000'000;
  // strftime_now's clock; local time now when empty.
  std::function<std::tm()> now;
};

class Template {
 public:
  // The syntax error says its line and column.
  static Result<Template> parse(std::string_view source);

  // Renders with `variables` as the template's globals (messages, tools, bos_token, ...).
  // A raise_exception() in the template is an error whose message is the template's
  // own; other errors say where they happened.
  Result<std::string> render(const Dict& variables, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace troupe::text::jinja
