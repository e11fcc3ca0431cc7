// The OpenAI-compatible API's JSON: requests parsed and checked into engine
// requests, engine events turned into response objects and SSE chunks, and
// OpenAI error objects. No sockets here (http_server.cpp has them).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/api_error.hpp"
#include "net/lora_table.hpp"
#include "net/tool_calls.hpp"
#include "text/chat_template.hpp"
#include "text/reasoning_parser.hpp"
#include "text/tokenizer.hpp"
#include "troupe/engine.hpp"

namespace troupe::grammar {
class TokenMasker;
}

namespace troupe::net {

struct ChoiceText;  // net/choice_text.hpp

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
  // chat under --reasoning-parser: the parser as this request's output starts (read from
  // its prompt), which each choice copies; none when its thinking is not split out (no
  // parser, or an output constraint: the whole output is the answer).
  std::optional<text::ReasoningParser> reasoning;
  bool include_reasoning = true;  // vLLM's include_reasoning: false drops the thinking
  // POST /v1/responses (net/responses_api.hpp): the response object's fields that repeat
  // the request, as a JSON object's text; empty for the other routes.
  std::string responses_fields;
  bool responses() const { return !responses_fields.empty(); }
  // Completions: every prompt of a batch ("prompt" as a list of strings or of token
  // lists), the first also in generate.prompt. Choices are prompt-major: choice
  // prompt * n + i is the i-th of prompt `prompt`.
  std::vector<std::vector<TokenId>> prompts;
  bool echo = false;  // each choice opens with its prompt (and its logprobs when asked)
  // echo with max_tokens 0 (vLLM's prompt scoring): the engine runs one token (it needs
  // one), and the server drops it: each choice is its prompt and the prompt's logprobs.
  bool score_only = false;
  // echo: each prompt's text as the client gave it (a token prompt's, detokenized).
  std::vector<std::string> prompt_texts;
  // Candidates run per prompt; the n with the highest cumulative log-probability are
  // returned (best_of > n is never streamed).
  std::int32_t best_of = 1;
  bool want_prompt_logprobs = false;  // vLLM's prompt_logprobs: returned with each choice
  // The field the output's constraint (generate.params.grammar) came from: "guided_regex",
  // "response_format", "tools", ...
  std::string grammar_param;

  std::int32_t num_prompts() const {
    return prompts.empty() ? 1 : static_cast<std::int32_t>(prompts.size());
  }
  // Prompt i's tokens (generate.prompt when the request has one prompt).
  const std::vector<TokenId>& prompt(std::size_t i) const {
    return prompts.empty() ? generate.prompt : prompts[i];
  }
  // Engine sequences run for each prompt: best_of candidates, n when it was not given.
  std::int32_t sequences_per_prompt() const { return std::max(best_of, n); }
};

// What parsing needs of the served model; no engine, so that the parsers run (and are
// fuzzed) alone.
struct ApiContext {
  const text::Tokenizer* tokenizer = nullptr;
  std::int32_t max_model_len = 0;
  std::string served_model_name;
  std::vector<std::string> other_model_names;  // more names requests may use
  // LoRA adapters served beside the model (--lora-modules, and those loaded at run time):
  // a request whose `model` is an adapter's name runs with its slot. Shared by the copies
  // of a context, as the server's threads share the table.
  std::shared_ptr<LoraTable> loras = std::make_shared<LoraTable>();
  bool is_base_name(std::string_view model) const {
    return model == served_model_name ||
           std::find(other_model_names.begin(), other_model_names.end(), model) !=
               other_model_names.end();
  }
  // The adapter slot a request naming `model` runs with: 0 for the model itself, the
  // adapter's slot for an adapter's name; nothing for a name not served.
  std::optional<std::int32_t> adapter_of(std::string_view model) const {
    if (is_base_name(model)) return 0;
    if (auto lora = loras->find(model)) return lora->slot;
    return std::nullopt;
  }
  bool serves(std::string_view model) const { return adapter_of(model).has_value(); }
  // The template chat requests render through (null: the built-in ChatML).
  std::shared_ptr<const text::ChatTemplate> chat_template;
  // The most bytes of text one token can stand for: a prompt longer than max_model_len
  // times this cannot fit the context, and is refused before it is tokenized.
  std::size_t max_token_bytes = 4;
  // Whether the engine orders requests by their `priority` (--scheduling-policy priority);
  // without, a priority other than 0 is refused, as vLLM does.
  bool priority_scheduling = false;
  // The most top alternatives a token's logprobs may ask for (vLLM's --max-logprobs; the
  // sampler's bound, 20, at most).
  std::int32_t max_logprobs = 20;
  // How the model writes tool calls (from its chat template, or --tool-call-parser).
  ToolCallFormat tool_call_format = ToolCallFormat::hermes;
  // --reasoning-parser: a chat's thinking given apart as reasoning_content (none: off).
  std::optional<text::ReasoningFormat> reasoning_format;
  // The model's tokens as a grammar::TokenMasker: the server makes an output constraint's
  // first token mask with it before admitting the request (first_mask_refusal).
  std::shared_ptr<const grammar::TokenMasker> token_masker;
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
  std::size_t prompt_index = 0;                // which prompt of the request it continues
  double cumulative_logprob = 0.0;             // of its tokens (best_of ranks by it)
  std::vector<PromptLogprob> prompt_logprobs;  // when asked (prompt_logprobs, echo)
};

// What a request's choices cost: the prompts once each, every choice's output.
struct Usage {
  std::int64_t prompt_tokens = 0;
  std::int64_t cached_tokens = 0;
  std::int64_t completion_tokens = 0;
};
// The n choices of each prompt among its best_of candidates (`outputs` prompt-major,
// best_of per prompt): the highest cumulative log-probabilities, in that order (the
// earlier candidate on a tie); all of them, in order, when best_of is n.
std::vector<CompletionOutput> best_choices(const CompletionRequest& request,
                                           std::vector<CompletionOutput> outputs);

// One choice per output, in order (choice i is outputs[i]); with echo, each opens with
// its prompt.
std::string completion_response(const ApiContext& context, const std::string& id,
                                std::int64_t created, const CompletionRequest& request,
                                const std::vector<CompletionOutput>& outputs);
// The `model` an answer names: the adapter's name for a request run with a LoRA adapter
// (as vLLM's answers do), else the served model's name.
std::string answer_model(const ApiContext& context, const CompletionRequest& request);

// One SSE `data:` payload for a streamed event of choice `index` (text and, on
// its last one, the finish reason).
// `called`: the choice's output was read as tool calls (finish_reason "tool_calls").
// `text_offset`: where this event's text starts in the choice's text (its logprobs'
// text_offset).
std::string completion_chunk(const ApiContext& context, const std::string& id, std::int64_t created,
                             const CompletionRequest& request, const TokenEvent& event, int index,
                             bool called = false, std::size_t text_offset = 0);
// A chat stream's thinking for choice `index` (delta.reasoning_content, vLLM's).
std::string reasoning_chunk(const ApiContext& context, const CompletionRequest& request,
                            const std::string& id, std::int64_t created, std::string_view reasoning,
                            int index);
// A chat stream's tool call deltas for choice `index` (delta.tool_calls).
std::string tool_calls_chunk(const ApiContext& context, const CompletionRequest& request,
                             const std::string& id, std::int64_t created,
                             const std::vector<ToolCallDelta>& deltas, int index);
// A chat stream's first chunk for a choice: the assistant's role.
std::string chat_role_chunk(const ApiContext& context, const CompletionRequest& request,
                            const std::string& id, std::int64_t created, int index);
// The last chunk when stream_options.include_usage asks for it.
// `completion_tokens` sums over the choices; the prompt counts once.
std::string usage_chunk(const ApiContext& context, const std::string& id, std::int64_t created,
                        const CompletionRequest& request, const Usage& usage);
// A streamed completion's echo: choice `index` opens with its prompt's text (and the
// prompt's logprobs when asked), before its first token.
std::string echo_chunk(const ApiContext& context, const std::string& id, std::int64_t created,
                       const CompletionRequest& request, std::size_t prompt_index,
                       const std::vector<PromptLogprob>& prompt_logprobs, int index);

std::string models_response(const ApiContext& context);
// GET /v1/models/{model}: the served model's object, or 404 for any other name.
tl::expected<std::string, ApiError> model_response(const ApiContext& context,
                                                   std::string_view model);
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
// The longest id a socket message may carry (every frame of its request echoes it).
inline constexpr std::size_t kMostSocketIdBytes = 256;
struct WebSocketError {
  std::string id;  // the message's id when it had one of at most kMostSocketIdBytes
  ApiError error;
};

// Parses a socket message once (the chat/completion choice is made on the parsed object)
// and, for a generate, tokenizes its prompt.
tl::expected<WebSocketMessage, WebSocketError> parse_websocket_message(std::string_view text,
                                                                       const ApiContext& context);
// A "token" frame, or the "done" frame (finish reason, usage) when event.finished. `read`:
// a chat whose text is read (thinking, tool calls), what its ChoiceTextStream let out of
// this event (the text sent instead of the event's, its reasoning_content, and on the
// done frame the calls).
std::string websocket_event(const ApiContext& context, std::string_view id, const TokenEvent& event,
                            bool want_logprobs, const ChoiceText* read = nullptr);
std::string websocket_error(std::string_view id, const ApiError& error);

// OpenAI's finish_reason names ("stop", "length", ...).
// `called`: a stop that ended in tool calls is "tool_calls".
std::string_view openai_finish_reason(FinishReason reason, bool called = false);

}  // namespace troupe::net
