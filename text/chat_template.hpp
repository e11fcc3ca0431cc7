// Chat templates: the GGUF's tokenizer.chat_template is recognised as one of
// the common families and rendered by hand-written code for that family (no
// Jinja interpreter). Without a template, or with one not recognised, ChatML is
// used, as llama.cpp does.
#pragma once

#include <string>
#include <string_view>
#include <vector>

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

}  // namespace troupe::text
