#include <catch2/catch.hpp>

#include "support/test_support.hpp"
#include "text/chat_template.hpp"

using namespace troupe::text;

namespace {
const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
}

TEST_CASE("the real templates in ../shared are recognised", "[chat][shared]") {
  auto family = [](const char* file) {
    return detect_chat_family(
        troupe::test::read_text(troupe::test::shared_file("chat-templates/" + std::string(file))));
  };
  CHECK(family("Qwen-Qwen2.5-7B-Instruct.jinja") == ChatFamily::chatml);
  CHECK(family("meta-llama-Llama-3.1-8B-Instruct.jinja") == ChatFamily::llama3);
  CHECK(family("mistralai-Mistral-Nemo-Instruct-2407.jinja") == ChatFamily::mistral);
  CHECK(family("microsoft-Phi-3.5-mini-instruct.jinja") == ChatFamily::phi3);
  CHECK(family("google-gemma-2-2b-it.jinja") == ChatFamily::gemma);
}

TEST_CASE("no template, or an unknown one, falls back to ChatML", "[chat]") {
  CHECK(detect_chat_family("") == ChatFamily::chatml);
  CHECK(detect_chat_family("{{ messages }}") == ChatFamily::chatml);
  CHECK(detect_chat_family("[INST] <<SYS>> {{ x }}") == ChatFamily::llama2);
  CHECK(detect_chat_family("<|user|>\n{{ m }}</s>") == ChatFamily::zephyr);
}

TEST_CASE("each family renders a conversation the way its models were trained", "[chat]") {
  CHECK(render_chat(ChatFamily::chatml, kChat) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(render_chat(ChatFamily::llama3, kChat) ==
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(render_chat(ChatFamily::llama2, kChat) ==
        "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]");
  CHECK(render_chat(ChatFamily::mistral, kChat) ==
        "[INST]Hi[/INST]Hello!</s>[INST]Be brief.\n\nBye[/INST]");
  CHECK(
      render_chat(ChatFamily::zephyr, kChat) ==
      "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n<|user|>\nBye</s>\n"
      "<|assistant|>\n");
  CHECK(render_chat(ChatFamily::phi3, kChat) ==
        "<|system|>\nBe "
        "brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nBye<|end|>\n"
        "<|assistant|>\n");
  CHECK(render_chat(ChatFamily::gemma, kChat) ==
        "<start_of_turn>user\nBe "
        "brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
}

TEST_CASE("a model's own template renders through the interpreter, default system prompt and all",
          "[chat][shared]") {
  const auto qwen = ChatTemplate::create(troupe::test::read_text(troupe::test::shared_file(
                                             "chat-templates/Qwen-Qwen2.5-7B-Instruct.jinja")),
                                         "the model's own", {"", "<|im_end|>", false});
  REQUIRE(qwen.is_jinja());
  CHECK(qwen.warning().empty());
  CHECK(qwen.description() == "the model's own (Jinja, 2.4 KB)");
  ChatInput input;
  input.messages.push_back(jinja::Value(jinja::Dict{{{"role", "user"}, {"content", "Hi"}}}));
  CHECK(qwen.render(input).value() ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

  const auto gemma = ChatTemplate::create(troupe::test::read_text(troupe::test::shared_file(
                                              "chat-templates/google-gemma-2-2b-it.jinja")),
                                          "the model's own", {"<bos>", "<eos>", true});
  const auto turns = gemma.render(input);
  REQUIRE(turns.has_value());
  // The tokenizer adds BOS, so the template's own goes.
  CHECK(*turns == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
  input.messages.insert(input.messages.begin(),
                        jinja::Value(jinja::Dict{{{"role", "system"}, {"content", "Be brief."}}}));
  const auto refused = gemma.render(input);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().message == "System role not supported");
}

TEST_CASE("without a usable template the family renderer is the fallback, and says so", "[chat]") {
  const auto none = ChatTemplate::create("", "the model's own", {});
  CHECK_FALSE(none.is_jinja());
  CHECK(none.description() == "built-in chatml fallback");
  CHECK(none.warning().empty());
  const auto broken = ChatTemplate::create("[INST] {% if %}", "the model's own", {});
  CHECK(broken.description() == "built-in mistral fallback");
  CHECK(broken.warning() ==
        "the model's own does not parse (chat template syntax error at line 1, column 14: "
        "unexpected '%}')");
  ChatInput input;
  input.messages.push_back(jinja::Value(jinja::Dict{{{"role", "user"}, {"content", "Hi"}}}));
  CHECK(broken.render(input).value() == "[INST]Hi[/INST]");
}
