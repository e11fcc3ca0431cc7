// Reasoning parsers: a model's thinking and its answer, split whole and streamed alike;
// where the output starts read from the prompt that the real templates render (Qwen3's
// enable_thinking, DeepSeek-R1's opened <think>, gpt-oss's harmony header).
#include "text/reasoning_parser.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "support/test_support.hpp"
#include "text/chat_template.hpp"

using namespace troupe::text;

namespace {

ReasoningSplit whole(ReasoningFormat format, const std::string& prompt, const std::string& output) {
  return ReasoningParser(format, prompt).split(output);
}

// The output fed in pieces of `step` bytes: what comes out, joined.
ReasoningSplit streamed(ReasoningFormat format, const std::string& prompt,
                        const std::string& output, std::size_t step) {
  ReasoningParser parser(format, prompt);
  ReasoningSplit joined;
  for (std::size_t at = 0; at < output.size(); at += step) {
    const auto piece = parser.take(std::string_view(output).substr(at, step), false);
    joined.reasoning += piece.reasoning;
    joined.content += piece.content;
  }
  const auto end = parser.take("", true);
  joined.reasoning += end.reasoning;
  joined.content += end.content;
  return joined;
}

// Whole and in every piece size, the same split.
void check_split(ReasoningFormat format, const std::string& prompt, const std::string& output,
                 const std::string& reasoning, const std::string& content) {
  INFO("prompt: " << prompt << "\noutput: " << output);
  const auto all = whole(format, prompt, output);
  CHECK(all.reasoning == reasoning);
  CHECK(all.content == content);
  for (std::size_t step = 1; step <= output.size(); ++step) {
    INFO("pieces of " << step);
    const auto pieces = streamed(format, prompt, output, step);
    CHECK(pieces.reasoning == reasoning);
    CHECK(pieces.content == content);
  }
}

ChatInput user_says(const std::string& text, jinja::Dict kwargs = {}) {
  ChatInput input;
  input.messages.push_back(jinja::Value(jinja::Dict{{{"role", "user"}, {"content", text}}}));
  input.kwargs = std::move(kwargs);
  return input;
}

std::string render(const std::string& file, const ChatInput& input) {
  const auto chat_template = ChatTemplate::create(
      troupe::test::read_text(troupe::test::shared_file(file)), "the model's own", {"", "", false});
  REQUIRE(chat_template.is_jinja());
  const auto rendered = chat_template.render(input);
  INFO((rendered ? std::string() : rendered.error().message));
  REQUIRE(rendered.has_value());
  return *rendered;
}

}  // namespace

TEST_CASE("vLLM's parser names are known and others are not", "[text][reasoning]") {
  CHECK(reasoning_format_named("deepseek_r1") == ReasoningFormat::deepseek_r1);
  CHECK(reasoning_format_named("qwen3") == ReasoningFormat::qwen3);
  CHECK(reasoning_format_named("gpt_oss") == ReasoningFormat::gpt_oss);
  CHECK(reasoning_format_named("deepseek_v3") == ReasoningFormat::qwen3);
  CHECK_FALSE(reasoning_format_named("hermes").has_value());
  CHECK_FALSE(reasoning_format_named("").has_value());
  for (const auto format :
       {ReasoningFormat::deepseek_r1, ReasoningFormat::qwen3, ReasoningFormat::gpt_oss}) {
    CHECK(reasoning_format_named(reasoning_format_name(format)) == format);
  }
}

TEST_CASE("think tags split the thinking from the answer, whole and in any pieces",
          "[text][reasoning]") {
  const auto qwen3 = ReasoningFormat::qwen3;
  check_split(qwen3, "<|im_start|>assistant\n", "<think>\nLet me see.\n</think>\n\nHello!",
              "Let me see.", "Hello!");
  // No thinking written: all of it is the answer.
  check_split(qwen3, "<|im_start|>assistant\n", "Hello there.", "", "Hello there.");
  // A "<" that opens no tag is text.
  check_split(qwen3, "", "<b>bold</b>", "", "<b>bold</b>");
  // Cut off while thinking (max_tokens): what there is, is thinking.
  check_split(qwen3, "", "<think>I wonder", "I wonder", "");
  // A marker-like text inside the answer stays the answer's.
  check_split(qwen3, "", "<think>a</think>b </think> c", "a", "b </think> c");
}

TEST_CASE("DeepSeek-R1 thinks from the start, with or without writing its tag",
          "[text][reasoning]") {
  const auto r1 = ReasoningFormat::deepseek_r1;
  check_split(r1, "<｜Assistant｜>", "Hmm.</think>The answer is 4.", "Hmm.", "The answer is 4.");
  check_split(r1, "<｜Assistant｜>", "<think>Hmm.</think>4", "Hmm.", "4");
  // Never closed: all thinking, as vLLM's reads it.
  check_split(r1, "<｜Assistant｜>", "Still thinking", "Still thinking", "");
  // The prompt closed the thinking (thinking turned off): the answer only.
  check_split(r1, "<｜Assistant｜><think>\n</think>", "Just 4.", "", "Just 4.");
}

TEST_CASE("gpt-oss's analysis channel is the thinking and final the answer", "[text][reasoning]") {
  const auto oss = ReasoningFormat::gpt_oss;
  const std::string prompt = "<|start|>user<|message|>Hi<|end|><|start|>assistant";
  check_split(oss, prompt,
              "<|channel|>analysis<|message|>User greets. Reply.<|end|>"
              "<|start|>assistant<|channel|>final<|message|>Hello!<|return|>",
              "User greets. Reply.", "Hello!");
  // Without the end marker shown (it ends the sequence) the same.
  check_split(oss, prompt,
              "<|channel|>analysis<|message|>Think<|end|><|start|>assistant<|channel|>final"
              "<|message|>Answer",
              "Think", "Answer");
  // A model that answers plainly, with no harmony at all.
  check_split(oss, prompt, "Plain answer", "", "Plain answer");
  // "<|" in a message that is no marker is text.
  check_split(oss, prompt, "<|channel|>final<|message|>a <|b c d e f g h i j k l m n o p", "",
              "a <|b c d e f g h i j k l m n o p");
}

TEST_CASE("Qwen3's template with enable_thinking false leaves no thinking to find",
          "[text][reasoning][shared]") {
  const std::string file = "chat-templates/Qwen-Qwen3-0.6B.jinja";
  const std::string thinking = render(file, user_says("Hi"));
  CHECK(thinking.ends_with("<|im_start|>assistant\n"));
  check_split(ReasoningFormat::qwen3, thinking, "<think>\nHm.\n</think>\n\nHello!", "Hm.",
              "Hello!");
  const std::string off = render(file, user_says("Hi", jinja::Dict{{{"enable_thinking", false}}}));
  CHECK(off.ends_with("<think>\n\n</think>\n\n"));
  check_split(ReasoningFormat::qwen3, off, "Hello!", "", "Hello!");
  // Even as R1's parser reads it: the prompt closed the thinking.
  check_split(ReasoningFormat::deepseek_r1, off, "Hello!", "", "Hello!");
}

TEST_CASE("DeepSeek-R1's template opens the thinking in the prompt", "[text][reasoning][shared]") {
  const std::string prompt =
      render("chat-templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
             user_says("What is 2+2?", jinja::Dict{{{"enable_thinking", true}}}));
  CHECK(prompt.ends_with("<think>\n"));
  for (const auto format : {ReasoningFormat::deepseek_r1, ReasoningFormat::qwen3}) {
    check_split(format, prompt, "2 and 2 make 4.\n</think>\n\nThe answer is 4.", "2 and 2 make 4.",
                "The answer is 4.");
  }
}

TEST_CASE("gpt-oss's template leaves the output to open its channel", "[text][reasoning][shared]") {
  const std::string prompt = render("chat-templates/openai-gpt-oss-120b.jinja", user_says("Hi"));
  CHECK(prompt.ends_with("<|start|>assistant"));
  check_split(ReasoningFormat::gpt_oss, prompt,
              "<|channel|>analysis<|message|>Greeting.<|end|><|start|>assistant<|channel|>final"
              "<|message|>Hello!",
              "Greeting.", "Hello!");
}

TEST_CASE("thinking goes out as it is written, before the output ends", "[text][reasoning]") {
  // A parser that held everything until the last piece would pass every split above.
  ReasoningParser think(ReasoningFormat::qwen3, "");
  CHECK(think.take("<think>abc", false).reasoning == "abc");
  CHECK(think.take("</think>Hi", false).content == "Hi");
  ReasoningParser harmony(ReasoningFormat::gpt_oss, "<|start|>assistant");
  CHECK(harmony.take("<|channel|>analysis<|message|>abc", false).reasoning == "abc");
}
