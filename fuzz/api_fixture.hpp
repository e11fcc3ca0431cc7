// What the net/ fuzz targets share: a served model's API context (the built-in
// SentencePiece vocabulary of troupe's random models, a 256-token context) made
// once per process, and checks on what the server would send back.
#pragma once

#include <unistd.h>

#include <boost/json.hpp>
#include <cstdio>
#include <filesystem>
#include <string>

#include "fuzz_support.hpp"
#include "gguf/gguf_file.hpp"
#include "model/random_model.hpp"
#include "net/openai_api.hpp"
#include "net/responses_api.hpp"
#include "text/tokenizer.hpp"

namespace troupe::fuzz {

inline const text::Tokenizer& api_tokenizer() {
  static const text::Tokenizer tokenizer = builtin_spm_tokenizer(512);
  return tokenizer;
}

// The context every net target parses against; `family` picks the chat template.
inline const net::ApiContext& api_context(text::ChatFamily family = text::ChatFamily::chatml) {
  static net::ApiContext contexts[] = {
      net::make_api_context(api_tokenizer(), 256, "troupe", ""),
      net::make_api_context(api_tokenizer(), 256, "troupe", "[INST] <<SYS>>"),
      net::make_api_context(api_tokenizer(), 256, "troupe", "<|start_header_id|>"),
      net::make_api_context(api_tokenizer(), 256, "troupe", "<start_of_turn>"),
  };
  switch (family) {
    case text::ChatFamily::llama2:
      return contexts[1];
    case text::ChatFamily::llama3:
      return contexts[2];
    case text::ChatFamily::gemma:
      return contexts[3];
    default:
      return contexts[0];
  }
}

// Whatever the server sends must be JSON a client can parse.
inline void check_json(const std::string& text, const char* what) {
  boost::json::error_code ec;
  (void)boost::json::parse(text, ec);
  if (ec) std::fprintf(stderr, "not JSON (%s): %s\n", ec.message().c_str(), text.c_str());
  TROUPE_FUZZ_CHECK(!ec, what);
}

// An error for the client: a 4xx with a message, as valid JSON.
inline void check_client_error(const net::ApiError& error) {
  TROUPE_FUZZ_CHECK(error.status >= 400 && error.status < 500, "a request error is a 4xx");
  TROUPE_FUZZ_CHECK(!error.message.empty(), "an error says what is wrong");
  check_json(net::error_json(error), "error objects are JSON");
}

// What parsing promised the engine about an accepted request.
inline void check_request(const net::CompletionRequest& r, const net::ApiContext& context) {
  const auto& prompt = r.generate.prompt;
  TROUPE_FUZZ_CHECK(!prompt.empty(), "an accepted prompt is not empty");
  for (TokenId id : prompt) {
    TROUPE_FUZZ_CHECK(id >= 0 && static_cast<std::size_t>(id) < context.tokenizer->size(),
                      "prompt ids lie in the vocabulary");
  }
  TROUPE_FUZZ_CHECK(r.generate.params.max_tokens >= 1, "max_tokens is at least 1");
  TROUPE_FUZZ_CHECK(static_cast<std::int64_t>(prompt.size()) + r.generate.params.max_tokens <=
                        context.max_model_len,
                    "prompt and completion fit the context");
  TROUPE_FUZZ_CHECK(r.n >= 1 && r.n <= 16, "n is in [1, 16]");
  for (TokenId id : r.generate.params.stop_token_ids) {
    TROUPE_FUZZ_CHECK(id >= 0 && static_cast<std::size_t>(id) < context.tokenizer->size(),
                      "stop ids lie in the vocabulary");
  }
}

// Answers built from a request and made-up events are JSON (text through to_valid_utf8).
inline void check_answers(const net::CompletionRequest& r, const net::ApiContext& context) {
  TokenEvent token;
  token.request_id = 1;
  token.token = r.generate.prompt.front();
  token.text = context.tokenizer->decode(r.generate.prompt);
  token.top_logprobs = {{r.generate.prompt.back(), -0.5f}};
  TokenEvent end = token;
  end.finished = true;
  end.finish_reason = FinishReason::stop;
  end.num_prompt_tokens = static_cast<std::int32_t>(r.generate.prompt.size());
  end.num_generated_tokens = 1;
  check_json(net::completion_chunk(context, "id", 0, r, token, 0), "stream chunks are JSON");
  check_json(net::completion_chunk(context, "id", 0, r, end, 0), "last chunks are JSON");
  net::CompletionOutput output;
  output.text = token.text;
  output.tokens = {token};
  output.end = end;
  check_json(net::completion_response(context, "id", 0, r, {output}), "answers are JSON");
  if (r.responses()) {
    check_json(net::responses_response(context, "resp_1", 0, r, output), "responses are JSON");
  }
  check_json(net::websocket_event(context, "id", token, r.want_logprobs), "frames are JSON");
  check_json(net::websocket_event(context, "id", end, r.want_logprobs), "done frames are JSON");
}

}  // namespace troupe::fuzz
