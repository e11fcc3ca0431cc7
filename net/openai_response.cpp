// The OpenAI-compatible API's responses: engine events turned into completion and chat
// objects, SSE chunks, WebSocket frames, /v1/models, and OpenAI error objects. Requests
// are parsed in net/openai_request.cpp.
#include <algorithm>
#include <boost/json.hpp>
#include <iterator>

#include "net/choice_text.hpp"
#include "net/openai_api.hpp"
#include "text/tokenizer.hpp"
#include "text/unicode.hpp"

namespace troupe::net {

namespace json = boost::json;

std::string answer_model(const ApiContext& context, const CompletionRequest& request) {
  return request.generate.lora_adapter > 0 ? request.model : context.served_model_name;
}

namespace {

// The legacy completions shape: tokens, token_logprobs, top_logprobs (the sampled token
// always among them, as OpenAI's: logprobs 0 gives it alone) and text_offset (bytes from
// the choice's start). With `prompt`, the echoed prompt's tokens come first: its first
// token has no context, so null logprobs, as OpenAI's.
// `offset` is where the first output token's text starts in the choice's text; an echoed
// prompt's tokens are placed by their pieces within its text (`prompt_bytes` long).
json::object logprobs_json(const text::Tokenizer& tokenizer, const std::vector<TokenEvent>& events,
                           std::size_t offset = 0, const std::vector<TokenId>* prompt = nullptr,
                           const std::vector<PromptLogprob>* prompt_logprobs = nullptr,
                           std::size_t prompt_bytes = 0) {
  json::array tokens, token_logprobs, top, offsets;
  auto add = [&](TokenId token, json::value logprob, json::value entries, std::size_t at) {
    offsets.emplace_back(at);
    tokens.emplace_back(text::to_valid_utf8(tokenizer.piece(token)));
    token_logprobs.emplace_back(std::move(logprob));
    top.emplace_back(std::move(entries));
  };
  auto top_entries = [&](TokenId token, float logprob, const std::vector<TokenLogprob>& list) {
    json::object entries;
    for (const auto& t : list) entries[text::to_valid_utf8(tokenizer.piece(t.id))] = t.logprob;
    const std::string own = text::to_valid_utf8(tokenizer.piece(token));
    if (!entries.contains(own)) entries[own] = logprob;
    return entries;
  };
  if (prompt != nullptr) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < prompt->size(); ++i) {
      const PromptLogprob* entry =
          i > 0 && prompt_logprobs != nullptr && i - 1 < prompt_logprobs->size()
              ? &(*prompt_logprobs)[i - 1]
              : nullptr;
      const std::size_t here = std::min(at, prompt_bytes);
      if (entry == nullptr) {
        add((*prompt)[i], nullptr, nullptr, here);
      } else {
        add((*prompt)[i], entry->logprob,
            top_entries(entry->token, entry->logprob, entry->top_logprobs), here);
      }
      at += tokenizer.piece((*prompt)[i]).size();
    }
  }
  // Each output token at the text it brought (a token may bring none yet: a character's
  // first bytes wait for the rest).
  for (const auto& e : events) {
    add(e.token, e.logprob, top_entries(e.token, e.logprob, e.top_logprobs), offset);
    offset += e.text.size();
  }
  return json::object{{"tokens", std::move(tokens)},
                      {"token_logprobs", std::move(token_logprobs)},
                      {"top_logprobs", std::move(top)},
                      {"text_offset", std::move(offsets)}};
}

// vLLM's prompt_logprobs: null for the first token, then for each position a map from
// token id to {logprob, rank, decoded_token}: the prompt's own token and the top ones.
json::array prompt_logprobs_json(const text::Tokenizer& tokenizer,
                                 const std::vector<PromptLogprob>& entries) {
  json::array out;
  out.emplace_back(nullptr);
  for (const PromptLogprob& e : entries) {
    json::object position;
    auto put = [&](TokenId id, float logprob, std::int32_t rank) {
      position[std::to_string(id)] =
          json::object{{"logprob", logprob},
                       {"rank", rank},
                       {"decoded_token", text::to_valid_utf8(tokenizer.piece(id))}};
    };
    put(e.token, e.logprob, e.rank);
    for (std::size_t r = 0; r < e.top_logprobs.size(); ++r) {
      const auto& t = e.top_logprobs[r];
      if (t.id != e.token) put(t.id, t.logprob, static_cast<std::int32_t>(r + 1));
    }
    out.emplace_back(std::move(position));
  }
  return out;
}

// Chat's shape: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
// "bytes" are the token's exact bytes; "token" is their text, where a byte that is no
// whole UTF-8 character (a byte token such as <0xB2>, half of a character) reads U+FFFD,
// as in the completions' logprobs: JSON text is UTF-8.
json::object chat_logprobs_json(const text::Tokenizer& tokenizer,
                                const std::vector<TokenEvent>& events) {
  auto entry = [&](TokenId id, float logprob) {
    const std::string_view piece = tokenizer.piece(id);
    json::array bytes;
    for (unsigned char c : piece) bytes.emplace_back(c);
    return json::object{
        {"token", text::to_valid_utf8(piece)}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
  };
  json::array content;
  for (const auto& e : events) {
    json::object item = entry(e.token, e.logprob);
    json::array top;
    for (const auto& t : e.top_logprobs) top.emplace_back(entry(t.id, t.logprob));
    item["top_logprobs"] = std::move(top);
    content.emplace_back(std::move(item));
  }
  return json::object{{"content", std::move(content)}};
}

json::object usage_json(const Usage& usage) {
  return json::object{
      {"prompt_tokens", usage.prompt_tokens},
      {"completion_tokens", usage.completion_tokens},
      {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
      {"prompt_tokens_details", json::object{{"cached_tokens", usage.cached_tokens}}}};
}

// What every completion object and stream chunk opens with, in OpenAI's order; a caller
// adds "usage" after the choices where it has one.
json::object envelope(const ApiContext& context, const CompletionRequest& request,
                      const std::string& id, std::int64_t created, std::string_view object,
                      json::array choices) {
  return json::object{{"id", id},
                      {"object", object},
                      {"created", created},
                      {"model", answer_model(context, request)},
                      {"choices", std::move(choices)}};
}

std::string_view chunk_object(bool chat) {
  return chat ? "chat.completion.chunk" : "text_completion";
}

// An error's message, type and status code, as both an HTTP error object and a socket's
// error frame carry them.
json::object error_fields(const ApiError& error) {
  // Messages quote what the client sent (a path, a model name): never as bytes that
  // would make the answer invalid JSON.
  return json::object{{"message", text::to_valid_utf8(error.message)},
                      {"type", error.type},
                      {"code", error.status}};
}

}  // namespace

std::string_view openai_finish_reason(FinishReason reason, bool called) {
  if (reason == FinishReason::none) return "";
  if (called && reason == FinishReason::stop) return "tool_calls";
  // OpenAI has no name for a deadline: the output was cut short, as at max_tokens.
  if (reason == FinishReason::timeout) return "length";
  return finish_reason_name(reason);
}

std::string error_json(const ApiError& error) {
  json::object inner = error_fields(error);
  inner["param"] =
      error.param.empty() ? json::value(nullptr) : json::value(text::to_valid_utf8(error.param));
  return json::serialize(json::object{{"error", std::move(inner)}});
}

ApiError api_error(const Error& error) {
  if (error.code == ErrorCode::internal) return ApiError{500, error.message, "internal_error", ""};
  if (error.code == ErrorCode::unavailable || error.code == ErrorCode::timed_out) {
    return ApiError{503, error.message, "service_unavailable", ""};
  }
  return ApiError{400, error.message, "invalid_request_error", ""};
}

ApiError api_error(const TokenEvent& end) {
  return api_error(Error{end.error_code, end.error});
}

std::string completion_response(const ApiContext& context, const std::string& id,
                                std::int64_t created, const CompletionRequest& request,
                                const std::vector<CompletionOutput>& outputs) {
  json::array choices;
  Usage usage;
  std::vector<bool> counted(static_cast<std::size_t>(request.num_prompts()), false);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const CompletionOutput& output = outputs[i];
    usage.completion_tokens += output.end.num_generated_tokens;
    if (output.prompt_index < counted.size() && !counted[output.prompt_index]) {
      counted[output.prompt_index] = true;
      usage.prompt_tokens += output.end.num_prompt_tokens;
      usage.cached_tokens += output.end.num_cached_tokens;
    }
    json::object choice{{"index", i}};
    bool called = false;
    if (request.chat) {
      const ChoiceText read = read_choice_text(request, output.text);
      called = !read.calls.empty();
      json::object message{{"role", "assistant"}};
      // No answer beside calls or thinking is null, as vLLM's.
      message["content"] = (called || request.reasoning) && read.content.empty()
                               ? json::value(nullptr)
                               : json::value(text::to_valid_utf8(read.content));
      if (request.reasoning) {
        message["reasoning_content"] = read.reasoning.empty()
                                           ? json::value(nullptr)
                                           : json::value(text::to_valid_utf8(read.reasoning));
      }
      if (called) message["tool_calls"] = tool_calls_json(read.calls, false);
      choice["message"] = std::move(message);
      choice["logprobs"] = request.want_logprobs
                               ? json::value(chat_logprobs_json(*context.tokenizer, output.tokens))
                               : json::value(nullptr);
    } else if (request.echo) {
      const auto& prompt = request.prompt(output.prompt_index);
      const std::string& prompt_text = request.prompt_texts[output.prompt_index];
      choice["text"] = text::to_valid_utf8(prompt_text + output.text);
      choice["logprobs"] =
          request.want_logprobs
              ? json::value(logprobs_json(*context.tokenizer, output.tokens, prompt_text.size(),
                                          &prompt, &output.prompt_logprobs, prompt_text.size()))
              : json::value(nullptr);
    } else {
      choice["text"] = text::to_valid_utf8(output.text);
      choice["logprobs"] = request.want_logprobs
                               ? json::value(logprobs_json(*context.tokenizer, output.tokens))
                               : json::value(nullptr);
    }
    choice["finish_reason"] = std::string(openai_finish_reason(output.end.finish_reason, called));
    // vLLM's: a completion's choice carries its prompt's; a chat's come once, below.
    if (request.want_prompt_logprobs && !request.chat) {
      choice["prompt_logprobs"] = prompt_logprobs_json(*context.tokenizer, output.prompt_logprobs);
    }
    choices.emplace_back(std::move(choice));
  }
  json::object response =
      envelope(context, request, id, created, request.chat ? "chat.completion" : "text_completion",
               std::move(choices));
  response["usage"] = usage_json(usage);
  if (request.want_prompt_logprobs && request.chat && !outputs.empty()) {
    response["prompt_logprobs"] =
        prompt_logprobs_json(*context.tokenizer, outputs.front().prompt_logprobs);
  }
  return json::serialize(response);
}

std::string completion_chunk(const ApiContext& context, const std::string& id, std::int64_t created,
                             const CompletionRequest& request, const TokenEvent& event, int index,
                             bool called, std::size_t text_offset) {
  json::object choice{{"index", index}};
  const bool with_logprobs = request.want_logprobs && event.token != kNoToken;
  if (request.chat) {
    json::object delta;
    if (event.finished && event.text.empty()) {
      // The last chunk of a chat stream carries only the finish reason.
    } else {
      delta["content"] = text::to_valid_utf8(event.text);
    }
    choice["delta"] = std::move(delta);
    choice["logprobs"] = with_logprobs
                             ? json::value(chat_logprobs_json(*context.tokenizer, {event}))
                             : json::value(nullptr);
  } else {
    choice["text"] = text::to_valid_utf8(event.text);
    choice["logprobs"] = with_logprobs
                             ? json::value(logprobs_json(*context.tokenizer, {event}, text_offset))
                             : json::value(nullptr);
  }
  choice["finish_reason"] =
      event.finished ? json::value(std::string(openai_finish_reason(event.finish_reason, called)))
                     : json::value(nullptr);
  return json::serialize(envelope(context, request, id, created, chunk_object(request.chat),
                                  json::array{std::move(choice)}));
}

std::string reasoning_chunk(const ApiContext& context, const CompletionRequest& request,
                            const std::string& id, std::int64_t created, std::string_view reasoning,
                            int index) {
  json::object choice{
      {"index", index},
      {"delta", json::object{{"reasoning_content", text::to_valid_utf8(reasoning)}}},
      {"logprobs", nullptr},
      {"finish_reason", nullptr}};
  return json::serialize(
      envelope(context, request, id, created, chunk_object(true), json::array{std::move(choice)}));
}

std::string tool_calls_chunk(const ApiContext& context, const CompletionRequest& request,
                             const std::string& id, std::int64_t created,
                             const std::vector<ToolCallDelta>& deltas, int index) {
  json::object choice{{"index", index},
                      {"delta", json::object{{"tool_calls", tool_call_deltas_json(deltas)}}},
                      {"logprobs", nullptr},
                      {"finish_reason", nullptr}};
  return json::serialize(
      envelope(context, request, id, created, chunk_object(true), json::array{std::move(choice)}));
}

std::string chat_role_chunk(const ApiContext& context, const CompletionRequest& request,
                            const std::string& id, std::int64_t created, int index) {
  json::object choice{{"index", index},
                      {"delta", json::object{{"role", "assistant"}, {"content", ""}}},
                      {"logprobs", nullptr},
                      {"finish_reason", nullptr}};
  return json::serialize(
      envelope(context, request, id, created, chunk_object(true), json::array{std::move(choice)}));
}

std::string usage_chunk(const ApiContext& context, const std::string& id, std::int64_t created,
                        const CompletionRequest& request, const Usage& usage) {
  json::object chunk =
      envelope(context, request, id, created, chunk_object(request.chat), json::array{});
  chunk["usage"] = usage_json(usage);
  return json::serialize(chunk);
}

std::string echo_chunk(const ApiContext& context, const std::string& id, std::int64_t created,
                       const CompletionRequest& request, std::size_t prompt_index,
                       const std::vector<PromptLogprob>& prompt_logprobs, int index) {
  const auto& prompt = request.prompt(prompt_index);
  json::object choice{{"index", index},
                      {"text", text::to_valid_utf8(request.prompt_texts[prompt_index])}};
  const std::string& prompt_text = request.prompt_texts[prompt_index];
  choice["logprobs"] =
      request.want_logprobs
          ? json::value(logprobs_json(*context.tokenizer, {}, prompt_text.size(), &prompt,
                                      &prompt_logprobs, prompt_text.size()))
          : json::value(nullptr);
  choice["finish_reason"] = nullptr;
  return json::serialize(
      envelope(context, request, id, created, chunk_object(false), json::array{std::move(choice)}));
}

std::vector<CompletionOutput> best_choices(const CompletionRequest& request,
                                           std::vector<CompletionOutput> outputs) {
  const auto per_prompt = static_cast<std::size_t>(request.sequences_per_prompt());
  const auto n = static_cast<std::size_t>(request.n);
  if (per_prompt == n) return outputs;
  std::vector<CompletionOutput> chosen;
  for (std::size_t first = 0; first + per_prompt <= outputs.size(); first += per_prompt) {
    std::vector<std::size_t> order(per_prompt);
    for (std::size_t i = 0; i < per_prompt; ++i) order[i] = first + i;
    std::stable_sort(order.begin(), order.end(), [&outputs](std::size_t a, std::size_t b) {
      return outputs[a].cumulative_logprob > outputs[b].cumulative_logprob;
    });
    for (std::size_t i = 0; i < n; ++i) chosen.push_back(std::move(outputs[order[i]]));
  }
  return chosen;
}

std::string websocket_event(const ApiContext& context, std::string_view id, const TokenEvent& event,
                            bool want_logprobs, const ChoiceText* read) {
  if (event.finished && event.finish_reason == FinishReason::error) {
    return websocket_error(id, api_error(event));
  }
  json::object o{{"type", event.finished ? "done" : "token"},
                 {"id", id},
                 {"request", event.request_id},  // the engine's id (the live page's lanes)
                 {"text", text::to_valid_utf8(read ? read->content : event.text)}};
  if (read && !read->reasoning.empty()) {
    o["reasoning_content"] = text::to_valid_utf8(read->reasoning);
  }
  const bool called = read && !read->calls.empty();
  if (called) o["tool_calls"] = tool_calls_json(read->calls, false);
  if (event.token != kNoToken) o["token"] = event.token;
  if (want_logprobs && event.token != kNoToken) {
    o["logprob"] = event.logprob;
    json::array top;
    for (const auto& t : event.top_logprobs) {
      top.emplace_back(json::object{{"token", t.id},
                                    {"text", text::to_valid_utf8(context.tokenizer->piece(t.id))},
                                    {"logprob", t.logprob}});
    }
    o["top_logprobs"] = std::move(top);
  }
  if (event.finished) {
    o["finish_reason"] = std::string(openai_finish_reason(event.finish_reason, called));
    o["usage"] = usage_json(
        Usage{event.num_prompt_tokens, event.num_cached_tokens, event.num_generated_tokens});
  }
  return json::serialize(o);
}

std::string websocket_error(std::string_view id, const ApiError& error) {
  return json::serialize(json::object{
      {"type", "error"}, {"id", text::to_valid_utf8(id)}, {"error", error_fields(error)}});
}

namespace {
// vLLM's shape: an adapter's root is its path and its parent the model's name; the
// model's root is its own name and its parent null.
json::object model_object(const ApiContext& context, const std::string& name,
                          const LoraEntry* lora = nullptr) {
  json::value parent = nullptr;
  std::string root = context.served_model_name;
  if (lora != nullptr) {
    parent = json::string(context.served_model_name);
    root = lora->path;
  }
  return json::object{{"id", name},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "troupe"},
                      {"root", std::move(root)},
                      {"parent", std::move(parent)},
                      {"max_model_len", context.max_model_len},
                      // troupe's own: what a benchmark client needs to draw token ids.
                      {"vocab_size", context.tokenizer ? context.tokenizer->size() : 0}};
}
}  // namespace

std::string models_response(const ApiContext& context) {
  json::array data{model_object(context, context.served_model_name)};
  for (const auto& name : context.other_model_names) data.emplace_back(model_object(context, name));
  for (const auto& lora : context.loras->list()) {
    data.emplace_back(model_object(context, lora.name, &lora));
  }
  return json::serialize(json::object{{"object", "list"}, {"data", std::move(data)}});
}

tl::expected<std::string, ApiError> model_response(const ApiContext& context,
                                                   std::string_view model) {
  if (context.is_base_name(model))
    return json::serialize(model_object(context, std::string(model)));
  if (const auto lora = context.loras->find(model)) {
    return json::serialize(model_object(context, lora->name, &*lora));
  }
  return tl::unexpected(ApiError{404, "The model '" + std::string(model) + "' does not exist.",
                                 "NotFoundError", "model"});
}

}  // namespace troupe::net
