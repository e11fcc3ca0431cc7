// A reasoning model's output split into its thinking and its answer, as vLLM's
// --reasoning-parser does: `<think>...</think>` (DeepSeek-R1, Qwen3 and their kin) and
// gpt-oss's harmony channels (analysis is thinking, final the answer). Whole, or streamed
// piece by piece with the same result.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace troupe::text {

enum class ReasoningFormat {
  deepseek_r1,  // <think>...</think>; the output starts inside its thinking (R1 may not
                // write <think>), unless the prompt closed it
  qwen3,        // <think>...</think> when the output (or the prompt's end) opens it
  gpt_oss,      // <|channel|>analysis<|message|>...<|end|> then the final channel
};

// vLLM's names: deepseek_r1, qwen3, gpt_oss (and deepseek_v3, glm45: <think> as qwen3).
std::optional<ReasoningFormat> reasoning_format_named(std::string_view name);
std::string_view reasoning_format_name(ReasoningFormat format);

struct ReasoningSplit {
  std::string reasoning;  // the thinking, without its markers
  std::string content;    // the answer
};

// Splits one output. The rendered prompt tells where the output starts: a template that
// opened <think> for the model (DeepSeek-R1's, Qwen3-Thinking's) starts it inside its
// thinking; one that closed it (enable_thinking false) starts it in the answer. Each part
// is given without the whitespace around the markers.
class ReasoningParser {
 public:
  ReasoningParser(ReasoningFormat format, std::string_view prompt);

  // The next piece of output; `last`: the output ends here, and nothing is held back.
  // Text that may be the start of a marker waits for the next piece.
  ReasoningSplit take(std::string_view text, bool last);
  // A whole output at once (what take would give, piece by piece).
  ReasoningSplit split(std::string_view output) &&;

  ReasoningFormat format() const { return format_; }
  // Whether the output starts in its answer (the prompt closed the thinking), before any
  // text was taken.
  bool starts_in_answer() const { return state_ == State::content; }
  // The text after which the output is the answer: "</think>", or harmony's final channel.
  std::string_view answer_marker() const;

 private:
  enum class State {
    opening,    // before anything: a <think> may open the output
    reasoning,  // inside the thinking
    content,    // the answer
    header,     // harmony: a message's header, up to <|message|>
  };
  // Harmony's channels that are the answer's (final, commentary) or thinking's (analysis).
  enum class Channel { reasoning, content };

  void take_think(ReasoningSplit& out, bool last);
  void take_harmony(ReasoningSplit& out, bool last);
  // Gives out the first `count` held bytes as thinking or as answer.
  void emit(ReasoningSplit& out, bool to_reasoning, std::size_t count);

  ReasoningFormat format_;
  State state_ = State::opening;
  Channel channel_ = Channel::content;
  std::string held_;              // output not yet given out
  bool at_section_start_ = true;  // whitespace here is dropped
  std::string pending_space_;     // trailing whitespace of the reasoning, kept back
  bool saw_marker_ = false;       // harmony: the output has written a marker
};

}  // namespace troupe::text
