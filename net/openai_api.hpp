// The OpenAI-compatible API's JSON: requests parsed and checked into engine
// requests, engine events turned into response objects and SSE chunks, and
// OpenAI error objects. No sockets here (http_server.cpp has them).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "net/api_error.hpp"
#include "net/tool_calls.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"
#include "troupe/engine.hpp"

namespace troupe::net {

std::string error_json(const ApiError& error);

// An engine error as the client sees it, over HTTP and on the socket alike: 500 when the
// engine failed (ErrorCode::internal), 503 when nothing can serve it now (no replica is
// up), else 400 (the engine refused the request).
ApiError api_error(const Error& error);
// The error of a request that ended on FinishReason::error: the engine failed (500).
ApiError api_error(const TokenEvent& end);

struct CompletionRequest {
  GenerateRequest generate;
  std::string model;
  bool chat = false;   // /v1/chat/completions: chat objects, deltas, chat logprobs
  std::int32_t n = 1;  // choices: n sequences of the same prompt
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool want_logprobs = false;
  ToolRequest tools;  // chat: its tools and tool_choice
};

// What parsing needs of the served model; no engine, so that the parsers run (and are
// fuzzed) alone.
struct ApiContext {
  const text::Tokenizer* tokenizer = nullptr;
  std::int32_t max_model_len = 0;
  std::string served_model_name;
  // The template chat requests render through (null: the built-in ChatML).
  std::shared_ptr<const text::ChatTemplate> chat_template;
  // The most bytes of text one token can stand for: a prompt longer than max_model_len
  // times this cannot fit the context, and is refused before it is tokenized.
  std::size_t max_token_bytes = 4;
  // How the model writes tool calls (from its chat template, or --tool-call-parser).
  ToolCallFormat tool_call_format = ToolCallFormat::hermes;
};

// `chat_template` is Jinja text (the model's own, or --chat-template's), named by
// `chat_template_origin` in the log; see text::ChatTemplate::create for the fallback.
ApiContext make_api_context(const text::Tokenizer& tokenizer, std::int32_t max_model_len,
                            std::string served_model_name, std::string_view chat_template,
                            std::string chat_template_origin = "the model's own");

// Parses a /v1/completions body: the prompt (text or token ids) is tokenized here.
tl::expected<CompletionRequest, ApiError> parse_completion_request(std::string_view body,
                                                                   const ApiContext& context);
// Parses a /v1/chat/completions body: the messages go through the chat template.
tl::expected<CompletionRequest, ApiError> parse_chat_request(std::string_view body,
                                                             const ApiContext& context);

// What one finished request produced, for the non-streaming response.
struct CompletionOutput {
  std::string text;
  std::vector<TokenEvent> tokens;  // with logprobs when asked
  TokenEvent end;
};

// One choice per output, in order (choice i is outputs[i]).
std::string completion_response(const ApiContext& context, const std::string& id,
                                std::int64_t created, const CompletionRequest& request,
                                const std::vector<CompletionOutput>& outputs);
// One SSE `data:` payload for a streamed event of choice `index` (text and, on
// its last one, the finish reason).
// `called`: the choice's output was read as tool calls (finish_reason "tool_calls").
std::string completion_chunk(const ApiContext& context, const std::string& id, std::int64_t created,
                             const CompletionRequest& request, const TokenEvent& event, int index,
                             bool called = false);
// A chat stream's tool calls for choice `index`, whole, in one delta (sent at its end).
std::string tool_calls_chunk(const ApiContext& context, const std::string& id, std::int64_t created,
                             const std::vector<ToolCall>& calls, int index);
// A chat stream's first chunk for a choice: the assistant's role.
std::string chat_role_chunk(const ApiContext& context, const std::string& id, std::int64_t created,
                            int index);
// The last chunk when stream_options.include_usage asks for it.
// `completion_tokens` sums over the choices; the prompt counts once.
std::string usage_chunk(const ApiContext& context, const std::string& id, std::int64_t created,
                        const CompletionRequest& request, const TokenEvent& end,
                        std::int32_t completion_tokens);

std::string models_response(const ApiContext& context);
tl::expected<std::string, ApiError> tokenize_response(std::string_view body,
                                                      const ApiContext& context);
tl::expected<std::string, ApiError> detokenize_response(std::string_view body,
                                                        const ApiContext& context);

// --- WebSocket streaming (/v1/ws; the protocol is in docs/websocket.md) ---

struct WebSocketMessage {
  std::string type;           // "generate" or "cancel"
  std::string id;             // the client's own id for the request
  CompletionRequest request;  // a generate's: a chat when it has "messages"
};
struct WebSocketError {
  std::string id;  // the message's id when it had one
  ApiError error;
};

// Parses a socket message once (the chat/completion choice is made on the parsed object)
// and, for a generate, tokenizes its prompt.
tl::expected<WebSocketMessage, WebSocketError> parse_websocket_message(std::string_view text,
                                                                       const ApiContext& context);
// A "token" frame, or the "done" frame (finish reason, usage) when event.finished.
std::string websocket_event(const ApiContext& context, std::string_view id, const TokenEvent& event,
                            bool want_logprobs);
std::string websocket_error(std::string_view id, const ApiError& error);

// OpenAI's finish_reason names ("stop", "length", ...).
// `called`: a stop that ended in tool calls is "tool_calls".
std::string_view openai_finish_reason(FinishReason reason, bool called = false);

}  // namespace troupe::net
