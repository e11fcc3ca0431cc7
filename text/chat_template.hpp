// Chat templates: a conversation rendered into the prompt text. The model's own
// Jinja template (the GGUF's tokenizer.chat_template, or --chat-template's) runs
// through the interpreter of jinja/template.hpp; the hand-written family renderers
// below are the fallback for a model without one, or whose template does not parse
// (without a template, or with one not recognised, ChatML, as llama.cpp does).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja/template.hpp"
#include "troupe/result.hpp"

namespace troupe::text {

enum class ChatFamily {
  chatml,   // <|im_start|>role ... <|im_end|> (Qwen, Yi, many fine-tunes)
  llama2,   // [INST] <<SYS>> ... <</SYS>> ... [/INST]
  llama3,   // <|start_header_id|>role<|end_header_id|> ... <|eot_id|>
  mistral,  // [INST]...[/INST] with the system prompt before the last user turn
  zephyr,   // <|user|>\n...</s>
  phi3,     // <|user|>\n...<|end|>
  gemma,    // <start_of_turn>user ... <end_of_turn>
};

struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
};

std::string_view chat_family_name(ChatFamily family);

// The family a template's text belongs to; ChatML when empty or not recognised.
ChatFamily detect_chat_family(std::string_view chat_template);

// The prompt text (without BOS: the tokenizer adds it) for `messages`, ending
// with the assistant's turn opened when add_generation_prompt.
std::string render_chat(ChatFamily family, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt = true);

// What a conversation is rendered from: the messages as the client sent them (role,
// content, tool_calls, tool_call_id, name), the request's tools (none when absent)
// and its chat_template_kwargs.
struct ChatInput {
  jinja::List messages;
  jinja::Value tools = nullptr;
  jinja::Value documents = nullptr;  // retrieval documents (vLLM's, Hugging Face's)
  jinja::Dict kwargs;
  bool add_generation_prompt = true;
  // The prompt ends inside the final message (an assistant's prefill) rather than after
  // it: the text the template writes after that message's content is cut, as Hugging
  // Face's continue_final_message does. Needs add_generation_prompt false.
  bool continue_final_message = false;
};

// The special tokens' texts a template sees, and whether the tokenizer adds BOS itself.
struct ChatSpecialTokens {
  std::string bos_token;
  std::string eos_token;
  bool tokenizer_adds_bos = false;
};

// The chat template a server uses, chosen once at startup.
class ChatTemplate {
 public:
  // `source` is Jinja text (empty: the model has none); `origin` names it for the log
  // ("the model's own", "--chat-template file x.jinja"). A source without any tag, or
  // one that does not parse, falls back to its family's renderer, with a warning.
  static ChatTemplate create(std::string_view source, std::string origin, ChatSpecialTokens tokens);

  // The prompt text. When the tokenizer adds BOS, a BOS text the template printed at the
  // start is taken off (as llama.cpp does), so the prompt holds one BOS, not two.
  // Errors: the template's raise_exception (its own message) or a render error; with
  // continue_final_message, a final message whose text content the template does not
  // write as given.
  Result<std::string> render(const ChatInput& input) const;

  bool is_jinja() const { return jinja_.has_value(); }
  // For the startup log: "the model's own (Jinja, 1.2 KB)", "built-in chatml fallback".
  const std::string& description() const { return description_; }
  // Why the template was not used (a syntax error), empty when nothing went wrong.
  const std::string& warning() const { return warning_; }

 private:
  std::optional<jinja::Template> jinja_;
  ChatFamily family_ = ChatFamily::chatml;
  ChatSpecialTokens tokens_;
  std::string description_;
  std::string warning_;
};

}  // namespace troupe::text
