#include "text/chat_template.hpp"

#include <cstdio>

namespace troupe::text {

namespace {

bool has(std::string_view text, std::string_view what) {
  return text.find(what) != std::string_view::npos;
}

// The leading system message, if any, and the rest.
std::pair<std::string, std::vector<ChatMessage>> split_system(
    const std::vector<ChatMessage>& messages) {
  if (!messages.empty() && messages.front().role == "system") {
    return {messages.front().content, {messages.begin() + 1, messages.end()}};
  }
  return {{}, messages};
}

std::string render_llama2(const std::vector<ChatMessage>& messages) {
  auto [system, turns] = split_system(messages);
  std::string out;
  bool first_user = true;
  for (const auto& m : turns) {
    if (m.role == "user") {
      if (!first_user) out += "<s>";
      out += "[INST] ";
      if (first_user && !system.empty()) out += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
      out += m.content + " [/INST]";
      first_user = false;
    } else if (m.role == "assistant") {
      out += " " + m.content + " </s>";
    }
  }
  return out;
}

std::string render_mistral(const std::vector<ChatMessage>& messages) {
  auto [system, turns] = split_system(messages);
  std::size_t last_user = turns.size();
  for (std::size_t i = 0; i < turns.size(); ++i) {
    if (turns[i].role == "user") last_user = i;
  }
  std::string out;
  for (std::size_t i = 0; i < turns.size(); ++i) {
    const auto& m = turns[i];
    if (m.role == "user") {
      out += "[INST]";
      if (i == last_user && !system.empty()) out += system + "\n\n";
      out += m.content + "[/INST]";
    } else if (m.role == "assistant") {
      out += m.content + "</s>";
    }
  }
  return out;
}

}  // namespace

std::string_view chat_family_name(ChatFamily family) {
  switch (family) {
    case ChatFamily::chatml:
      return "chatml";
    case ChatFamily::llama2:
      return "llama-2";
    case ChatFamily::llama3:
      return "llama-3";
    case ChatFamily::mistral:
      return "mistral";
    case ChatFamily::zephyr:
      return "zephyr";
    case ChatFamily::phi3:
      return "phi-3";
    case ChatFamily::gemma:
      return "gemma";
  }
  return "chatml";
}

ChatFamily detect_chat_family(std::string_view t) {
  if (has(t, "<|im_start|>")) return ChatFamily::chatml;
  if (has(t, "<|start_header_id|>")) return ChatFamily::llama3;
  if (has(t, "<start_of_turn>")) return ChatFamily::gemma;
  if (has(t, "[INST]")) return has(t, "<<SYS>>") ? ChatFamily::llama2 : ChatFamily::mistral;
  if (has(t, "<|user|>")) return has(t, "<|end|>") ? ChatFamily::phi3 : ChatFamily::zephyr;
  return ChatFamily::chatml;
}

std::string render_chat(ChatFamily family, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt) {
  std::string out;
  switch (family) {
    case ChatFamily::chatml:
      for (const auto& m : messages)
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case ChatFamily::llama3:
      for (const auto& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatFamily::llama2:
      return render_llama2(messages);
    case ChatFamily::mistral:
      return render_mistral(messages);
    case ChatFamily::zephyr:
      for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + "</s>\n";
      if (add_generation_prompt) out += "<|assistant|>\n";
      return out;
    case ChatFamily::phi3:
      for (const auto& m : messages) out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
      if (add_generation_prompt) out += "<|assistant|>\n";
      return out;
    case ChatFamily::gemma: {
      // No system role: it opens the first user turn.
      auto [system, turns] = split_system(messages);
      for (std::size_t i = 0; i < turns.size(); ++i) {
        const auto& m = turns[i];
        const std::string role = m.role == "assistant" ? "model" : m.role;
        std::string content = m.content;
        if (i == 0 && !system.empty()) content = system + "\n\n" + content;
        out += "<start_of_turn>" + role + "\n" + content + "<end_of_turn>\n";
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      return out;
    }
  }
  return out;
}

namespace {

std::string size_text(std::size_t bytes) {
  char buf[32];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KB", static_cast<double>(bytes) / 1024.0);
  }
  return buf;
}

// The family renderers see each message's role and text content only.
std::vector<ChatMessage> plain_messages(const jinja::List& messages) {
  std::vector<ChatMessage> out;
  for (const auto& m : messages) {
    if (!m.is_dict()) continue;
    const jinja::Value* role = m.as_dict().find("role");
    const jinja::Value* content = m.as_dict().find("content");
    out.push_back({role != nullptr && role->is_string() ? role->as_string() : "user",
                   content != nullptr && content->is_string() ? content->as_string() : ""});
  }
  return out;
}

}  // namespace

ChatTemplate ChatTemplate::create(std::string_view source, std::string origin,
                                  ChatSpecialTokens tokens) {
  ChatTemplate t;
  t.tokens_ = std::move(tokens);
  t.family_ = detect_chat_family(source);
  const std::string fallback = "built-in " + std::string(chat_family_name(t.family_)) + " fallback";
  if (source.find("{{") == std::string_view::npos && source.find("{%") == std::string_view::npos) {
    t.description_ = fallback;
    if (!source.empty()) t.warning_ = origin + " has no Jinja tags; it is not a chat template";
    return t;
  }
  auto parsed = jinja::Template::parse(source);
  if (!parsed) {
    t.description_ = fallback;
    t.warning_ = origin + " does not parse (" + parsed.error().message + ")";
    return t;
  }
  t.jinja_ = std::move(*parsed);
  t.description_ = origin + " (Jinja, " + size_text(source.size()) + ")";
  return t;
}

namespace {

// Hugging Face's continue_final_message: the prompt ends where the final message's content
// does, so the model carries on writing it (the template's end-of-turn is cut).
Result<std::string> continue_final(std::string prompt, const jinja::List& messages) {
  const jinja::Value* content = nullptr;
  if (!messages.empty() && messages.back().is_dict()) {
    content = messages.back().as_dict().find("content");
  }
  if (content == nullptr || !content->is_string() || content->as_string().empty()) {
    return make_error(ErrorCode::invalid_argument,
                      "continue_final_message needs a final message with text content");
  }
  std::string text = content->as_string();
  auto at = prompt.rfind(text);
  if (at == std::string::npos) {  // a template that trims the content writes it trimmed
    const auto first = text.find_first_not_of(" \t\n");
    const auto last = text.find_last_not_of(" \t\n");
    if (first != std::string::npos) text = text.substr(first, last - first + 1);
    at = prompt.rfind(text);
  }
  if (at == std::string::npos) {
    return make_error(ErrorCode::invalid_argument,
                      "continue_final_message: the chat template does not write the final "
                      "message's content as given, so it cannot be continued");
  }
  prompt.resize(at + text.size());
  return prompt;
}

}  // namespace

Result<std::string> ChatTemplate::render(const ChatInput& input) const {
  if (!jinja_) {
    std::string prompt =
        render_chat(family_, plain_messages(input.messages), input.add_generation_prompt);
    if (!input.continue_final_message) return prompt;
    return continue_final(std::move(prompt), input.messages);
  }
  // As Hugging Face calls it: the kwargs, then the variables it always passes.
  jinja::Dict variables = input.kwargs;
  variables.set("messages", input.messages);
  variables.set("tools", input.tools);
  variables.set("documents", input.documents);
  variables.set("add_generation_prompt", input.add_generation_prompt);
  variables.set("bos_token", tokens_.bos_token);
  variables.set("eos_token", tokens_.eos_token);
  TROUPE_TRY(std::string prompt, jinja_->render(variables));
  if (tokens_.tokenizer_adds_bos && !tokens_.bos_token.empty() &&
      prompt.starts_with(tokens_.bos_token)) {
    prompt.erase(0, tokens_.bos_token.size());
  }
  if (!input.continue_final_message) return prompt;
  return continue_final(std::move(prompt), input.messages);
}

}  // namespace troupe::text
