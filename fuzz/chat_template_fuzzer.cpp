// The chat template code on arbitrary input: detect_chat_family on the text as
// a template, and render_chat for every family over messages decoded from it,
// with and without the generation prompt.
//
// Input: records separated by 0x1e. The first is the template text; each other
// is a message whose first byte picks the role ('s' system, 'u' user, 'a'
// assistant; any other byte is itself the role) and whose rest is the content.
// Invariants (abort when broken):
//   - every user and assistant content appears in the prompt, in every family,
//     and so does a leading system prompt once a user message follows it;
//   - the generation prompt only appends, and exactly the family's opening of
//     the assistant's turn (Llama-2 and Mistral templates add none);
//   - a conversation renders to a prefix of what it renders to with one more
//     message (not Mistral, whose system prompt moves to the last user turn);
//   - a template that holds "<|im_start|>" is ChatML.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"
#include "text/chat_template.hpp"

using namespace troupe::text;

namespace {

constexpr ChatFamily kFamilies[] = {ChatFamily::chatml,  ChatFamily::llama2, ChatFamily::llama3,
                                    ChatFamily::mistral, ChatFamily::zephyr, ChatFamily::phi3,
                                    ChatFamily::gemma};

std::vector<std::string_view> split_records(std::string_view input) {
  std::vector<std::string_view> records;
  for (std::size_t pos = 0;;) {
    const std::size_t end = input.find('\x1e', pos);
    records.push_back(input.substr(pos, end == std::string_view::npos ? end : end - pos));
    if (end == std::string_view::npos) return records;
    pos = end + 1;
  }
}

ChatMessage decode_message(std::string_view record) {
  if (record.empty()) return {"user", ""};
  std::string role;
  switch (record[0]) {
    case 's':
      role = "system";
      break;
    case 'u':
      role = "user";
      break;
    case 'a':
      role = "assistant";
      break;
    default:
      role = std::string(1, record[0]);
  }
  return {role, std::string(record.substr(1))};
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

std::string_view generation_prompt(ChatFamily family) {
  switch (family) {
    case ChatFamily::chatml:
      return "<|im_start|>assistant\n";
    case ChatFamily::llama3:
      return "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatFamily::zephyr:
    case ChatFamily::phi3:
      return "<|assistant|>\n";
    case ChatFamily::gemma:
      return "<start_of_turn>model\n";
    case ChatFamily::llama2:
    case ChatFamily::mistral:
      return "";
  }
  return "";
}

void check_family(ChatFamily family, const std::vector<ChatMessage>& messages) {
  const std::string closed = render_chat(family, messages, /*add_generation_prompt=*/false);
  const std::string open = render_chat(family, messages, /*add_generation_prompt=*/true);
  TROUPE_FUZZ_CHECK(open == closed + std::string(generation_prompt(family)),
                    "the generation prompt is not the family's assistant opening");
  for (const ChatMessage& m : messages) {
    if (m.role != "user" && m.role != "assistant") continue;
    TROUPE_FUZZ_CHECK(closed.find(m.content) != std::string::npos,
                      "a message's content is missing from the prompt");
  }
  const bool user_follows =
      messages.size() > 1 && std::any_of(messages.begin() + 1, messages.end(),
                                         [](const ChatMessage& m) { return m.role == "user"; });
  if (!messages.empty() && messages[0].role == "system" && user_follows) {
    TROUPE_FUZZ_CHECK(closed.find(messages[0].content) != std::string::npos,
                      "the system prompt is missing from the prompt");
  }
  if (family != ChatFamily::mistral && !messages.empty()) {
    const std::vector<ChatMessage> shorter(messages.begin(), messages.end() - 1);
    TROUPE_FUZZ_CHECK(starts_with(closed, render_chat(family, shorter, false)),
                      "one more message changed what came before it");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string_view> records = split_records(input);

  const std::string_view chat_template = records[0];
  const ChatFamily detected = detect_chat_family(chat_template);
  (void)chat_family_name(detected);
  if (chat_template.find("<|im_start|>") != std::string_view::npos) {
    TROUPE_FUZZ_CHECK(detected == ChatFamily::chatml, "a ChatML template was not recognised");
  }
  // The whole input read as a template, too: the records' separators are text to it.
  (void)detect_chat_family(input);

  std::vector<ChatMessage> messages;
  for (std::size_t i = 1; i < records.size(); ++i) messages.push_back(decode_message(records[i]));
  for (const ChatFamily family : kFamilies) check_family(family, messages);
  return 0;
}
