// The OpenAI-compatible API's requests: completion, chat and WebSocket bodies parsed and
// checked into engine requests (prompts tokenized, chats through their template), and
// /tokenize, /detokenize. Responses are rendered in net/openai_response.cpp.
#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <iterator>
#include <limits>

#include "grammar/token_masker.hpp"
#include "net/chat_input.hpp"
#include "net/openai_api.hpp"
#include "net/request_fields.hpp"
#include "net/structured_output.hpp"
#include "text/tokenizer.hpp"
#include "text/unicode.hpp"

namespace troupe::net {

namespace json = boost::json;
using namespace fields;

namespace {

// The sampling, stop and streaming fields both endpoints share; r.generate.prompt is set.
tl::expected<void, ApiError> parse_common(const json::object& o, const ApiContext& context,
                                          CompletionRequest& r) {
  const auto& tokenizer = *context.tokenizer;
  auto& p = r.generate.params;
  p.temperature = 1.0f;
  constexpr Wide kInt32Max = std::numeric_limits<std::int32_t>::max();
  constexpr Wide kUint64Max = std::numeric_limits<std::uint64_t>::max();
  TROUPE_API_TRY(auto max_tokens, integer(o, "max_tokens"));
  if (r.chat && !max_tokens) {
    TROUPE_API_TRY(max_tokens, integer(o, "max_completion_tokens"));
  }
  TROUPE_API_TRY(const auto temperature, number(o, "temperature"));
  TROUPE_API_TRY(const auto top_p, number(o, "top_p"));
  TROUPE_API_TRY(const auto top_k, integer_in(o, "top_k", -1, kInt32Max));
  TROUPE_API_TRY(const auto min_p, number(o, "min_p"));
  // llama.cpp's clients send -1 for "no seed"; any other seed is an unsigned 64-bit integer.
  TROUPE_API_TRY(const auto seed, integer_in(o, "seed", -1, kUint64Max));
  TROUPE_API_TRY(const auto presence, number(o, "presence_penalty"));
  TROUPE_API_TRY(const auto frequency, number(o, "frequency_penalty"));
  TROUPE_API_TRY(const auto repetition, number(o, "repetition_penalty"));
  TROUPE_API_TRY(const auto min_tokens, integer_in(o, "min_tokens", 0, kInt32Max));
  TROUPE_API_TRY(const auto n, integer_in(o, "n", 1, 16));
  TROUPE_API_TRY(const auto stream, boolean(o, "stream"));
  TROUPE_API_TRY(const auto ignore_eos, boolean(o, "ignore_eos"));
  // vLLM's: lower is more urgent; meaningful only under --scheduling-policy priority.
  TROUPE_API_TRY(const auto priority,
                 integer_in(o, "priority", std::numeric_limits<std::int32_t>::min(), kInt32Max));
  if (priority && *priority != 0 && !context.priority_scheduling) {
    return tl::unexpected(
        bad_request("'priority' other than 0 needs a server started with --scheduling-policy "
                    "priority (this one serves first come, first served)",
                    "priority"));
  }
  if (priority) r.generate.priority = static_cast<std::int32_t>(*priority);
  std::optional<Wide> logprobs;
  if (r.chat) {  // chat: "logprobs": true and "top_logprobs": n
    TROUPE_API_TRY(const auto want, boolean(o, "logprobs"));
    TROUPE_API_TRY(const auto top, integer_in(o, "top_logprobs", 0, Wide{context.max_logprobs}));
    // As OpenAI and vLLM: alternatives asked for without the logprobs they come with are
    // the client's error, not silently nothing.
    if (top && *top > 0 && !want.value_or(false)) {
      return tl::unexpected(bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs"));
    }
    if (want.value_or(false)) logprobs = top.value_or(0);
  } else {
    TROUPE_API_TRY(logprobs, integer_in(o, "logprobs", 0, Wide{context.max_logprobs}));
  }
  TROUPE_API_TRY(const auto prompt_logprobs,
                 integer_in(o, "prompt_logprobs", 0, Wide{context.max_logprobs}));
  if (n) r.n = static_cast<std::int32_t>(*n);
  // The longest prompt of a batch is the one that must fit.
  std::size_t longest = r.generate.prompt.size();
  for (const auto& prompt : r.prompts) longest = std::max(longest, prompt.size());
  const auto num_prompt = static_cast<Wide>(longest);
  const std::int32_t limit = context.max_model_len;
  Wide wanted = p.max_tokens;
  if (max_tokens) {
    if (*max_tokens == 0 && !r.chat && r.echo) {
      // vLLM's prompt scoring: the prompt and its logprobs, nothing generated. The engine
      // runs one token, which the server drops (CompletionRequest::score_only).
      r.score_only = true;
      wanted = 1;
    } else if (*max_tokens < 1) {
      return tl::unexpected(bad_request("'max_tokens' must be at least 1" +
                                            std::string(r.chat ? ""
                                                               : " (0 with echo: the prompt "
                                                                 "scored, nothing generated)") +
                                            ", not " + wide_string(*max_tokens),
                                        "max_tokens"));
    } else {
      wanted = *max_tokens;
    }
  }
  if (r.score_only && min_tokens && *min_tokens > 0) {
    return tl::unexpected(
        bad_request("'min_tokens' needs tokens to generate, and 'max_tokens' is 0", "min_tokens"));
  }
  // What the client sent is quoted as sent, however large.
  if (num_prompt + wanted > limit) {
    return tl::unexpected(bad_request(
        "This model's maximum context length is " + std::to_string(limit) +
            " tokens. However, you requested " + wide_string(num_prompt + wanted) + " tokens (" +
            wide_string(num_prompt) + " in the prompt, " + wide_string(wanted) +
            " in the completion). Please reduce the prompt or max_tokens.",
        num_prompt < limit ? "max_tokens" : "prompt"));
  }
  p.max_tokens = static_cast<std::int32_t>(wanted);
  if (temperature) p.temperature = static_cast<float>(*temperature);
  if (top_p) p.top_p = static_cast<float>(*top_p);
  if (top_k) p.top_k = static_cast<std::int32_t>(*top_k);
  if (min_p) p.min_p = static_cast<float>(*min_p);
  if (seed && *seed >= 0) p.seed = static_cast<std::uint64_t>(*seed);
  if (presence) p.presence_penalty = static_cast<float>(*presence);
  if (frequency) p.frequency_penalty = static_cast<float>(*frequency);
  if (repetition) p.repetition_penalty = static_cast<float>(*repetition);
  if (min_tokens) p.min_tokens = static_cast<std::int32_t>(*min_tokens);
  if (logprobs) {
    p.logprobs = static_cast<std::int32_t>(*logprobs);
    r.want_logprobs = true;
  }
  if (ignore_eos) p.ignore_eos = *ignore_eos;
  // vLLM's detokenization fields. spaces_between_special_tokens is read and checked but
  // changes nothing: GGUF vocabularies spell their control tokens whole, and troupe never
  // puts spaces between them (as vLLM's fast tokenizers do not).
  TROUPE_API_TRY(const auto skip_special, boolean(o, "skip_special_tokens"));
  TROUPE_API_TRY(const auto include_stop, boolean(o, "include_stop_str_in_output"));
  TROUPE_API_TRY(const auto spaces_between, boolean(o, "spaces_between_special_tokens"));
  (void)spaces_between;
  if (skip_special) r.generate.skip_special_tokens = *skip_special;
  if (include_stop) r.generate.include_stop_str_in_output = *include_stop;
  if (prompt_logprobs) {
    p.prompt_logprobs = static_cast<std::int32_t>(*prompt_logprobs);
    r.want_prompt_logprobs = true;
  }
  TROUPE_API_TRY(p.logit_bias, logit_bias(o, tokenizer.size()));
  r.stream = stream.value_or(false);
  if (r.stream && r.want_prompt_logprobs) {
    return tl::unexpected(bad_request(
        "'prompt_logprobs' is not streamed: ask without 'stream' (or use echo with logprobs)",
        "prompt_logprobs"));
  }
  if (const auto* stop = o.if_contains("stop"); stop != nullptr && !stop->is_null()) {
    if (stop->is_string()) {
      r.generate.stop.emplace_back(stop->get_string());
    } else if (stop->is_array()) {
      for (const auto& s : stop->as_array()) {
        if (!s.is_string()) return tl::unexpected(bad_request("'stop' must hold strings", "stop"));
        r.generate.stop.emplace_back(s.get_string());
      }
    } else {
      return tl::unexpected(bad_request("'stop' must be a string or an array of strings", "stop"));
    }
    if (auto bounded = check_stop_strings(r.generate.stop); !bounded) {
      return tl::unexpected(bounded.error());
    }
  }
  if (const auto* ids = o.if_contains("stop_token_ids"); ids != nullptr && !ids->is_null()) {
    if (!ids->is_array()) {
      return tl::unexpected(bad_request("'stop_token_ids' must be an array", "stop_token_ids"));
    }
    // Each one is looked up at every generated token, on the engine's thread.
    if (ids->as_array().size() > kMostStopTokenIds) {
      return tl::unexpected(bad_request("at most " + std::to_string(kMostStopTokenIds) +
                                            " stop token ids, not " +
                                            std::to_string(ids->as_array().size()),
                                        "stop_token_ids"));
    }
    TROUPE_API_TRY(p.stop_token_ids, token_array(*ids, "stop_token_ids", tokenizer.size()));
  }
  TROUPE_API_TRY(p.grammar, output_grammar(o, &r.grammar_param));
  if (const auto* so = o.if_contains("stream_options"); so != nullptr && so->is_object()) {
    TROUPE_API_TRY(const auto usage, boolean(so->as_object(), "include_usage"));
    r.include_usage = usage.value_or(false);
  }
  return {};
}

// A text longer than the context can hold whatever its tokens is refused before it is
// tokenized: tokenizing megabytes only to refuse them would hold a thread for seconds.
tl::expected<void, ApiError> check_prompt_bytes(std::size_t num_bytes, const ApiContext& context,
                                                const char* param = "prompt") {
  const auto most = static_cast<std::size_t>(std::max(context.max_model_len, 0)) *
                    std::max<std::size_t>(context.max_token_bytes, 1);
  if (num_bytes <= most) return {};
  return tl::unexpected(bad_request(
      "This model's maximum context length is " + std::to_string(context.max_model_len) +
          " tokens. However, your prompt's " + std::to_string(num_bytes) +
          " bytes are more than that many tokens can hold (" +
          std::to_string(context.max_token_bytes) +
          " bytes a token at most). Please reduce the prompt.",
      param));
}

// vLLM's truncate_prompt_tokens: a prompt keeps its last k tokens (-1: as many as the
// context holds). None when not given.
tl::expected<std::optional<std::size_t>, ApiError> prompt_truncation(const json::object& o,
                                                                     const ApiContext& context) {
  TROUPE_API_TRY(const auto k, integer(o, "truncate_prompt_tokens"));
  if (!k) return std::optional<std::size_t>{};
  if (*k == -1) return std::optional<std::size_t>{static_cast<std::size_t>(context.max_model_len)};
  if (*k < 1 || *k > context.max_model_len) {
    return tl::unexpected(bad_request(
        "'truncate_prompt_tokens' must be in [1, " + std::to_string(context.max_model_len) +
            "] (the model's context), or -1 for the whole context, not " + wide_string(*k),
        "truncate_prompt_tokens"));
  }
  return std::optional<std::size_t>{static_cast<std::size_t>(*k)};
}

// Keeps the last `keep` tokens of `ids`; whether any were cut.
bool truncate_prompt(std::vector<TokenId>& ids, std::optional<std::size_t> keep) {
  if (!keep || ids.size() <= *keep) return false;
  ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(*keep));
  return true;
}

tl::expected<CompletionRequest, ApiError> completion_request(const json::object& o,
                                                             const ApiContext& context,
                                                             bool socket = false) {
  if (auto known = check_fields(o, false, socket); !known) return tl::unexpected(known.error());
  CompletionRequest r;
  if (auto checked = check_model(o, context, r); !checked) return tl::unexpected(checked.error());
  const auto& tokenizer = *context.tokenizer;
  const auto* prompt = o.if_contains("prompt");
  if (prompt == nullptr) return tl::unexpected(bad_request("'prompt' is required", "prompt"));
  auto is_id = [](const json::value& v) { return v.is_int64() || v.is_uint64(); };
  // One prompt (a text, or token ids) or a batch (texts, or lists of token ids).
  std::vector<const json::value*> items;
  if (prompt->is_string() ||
      (prompt->is_array() && !prompt->as_array().empty() && is_id(prompt->as_array()[0]))) {
    items.push_back(prompt);
  } else if (prompt->is_array() && !prompt->as_array().empty()) {
    for (const auto& item : prompt->as_array()) items.push_back(&item);
  } else {
    return tl::unexpected(bad_request(
        "'prompt' must be a string, an array of token ids, or an array of either", "prompt"));
  }
  if (items.size() > kMostPrompts) {
    return tl::unexpected(bad_request("at most " + std::to_string(kMostPrompts) +
                                          " prompts in one request, not " +
                                          std::to_string(items.size()),
                                      "prompt"));
  }
  const auto* suffix = o.if_contains("suffix");
  const bool fill_in = suffix != nullptr && !suffix->is_null() &&
                       !(suffix->is_string() && suffix->get_string().empty());
  const auto& vocab = tokenizer.vocabulary();
  if (fill_in && !suffix->is_string()) {
    return tl::unexpected(bad_request("'suffix' must be a string", "suffix"));
  }
  if (fill_in && !vocab.has_fill_in_the_middle()) {
    return tl::unexpected(bad_request(
        "'suffix' needs a model with fill-in-the-middle tokens, and this one has none", "suffix"));
  }
  TROUPE_API_TRY(const auto echo, boolean(o, "echo"));
  r.echo = echo.value_or(false);
  TROUPE_API_TRY(const auto truncation, prompt_truncation(o, context));
  if (r.echo && fill_in) {
    return tl::unexpected(bad_request("'echo' and 'suffix' cannot be used together", "echo"));
  }
  for (const json::value* item : items) {
    std::vector<TokenId> ids;
    std::string text;
    if (item->is_string()) {
      text = std::string(item->get_string());
      if (auto fits = check_prompt_bytes(text.size(), context); !fits) {
        return tl::unexpected(fits.error());
      }
      ids = tokenizer.encode(text, /*add_special=*/!fill_in);
    } else if (item->is_array() && !item->as_array().empty() && is_id(item->as_array()[0])) {
      TROUPE_API_TRY(ids, token_array(*item, "prompt", tokenizer.size()));
      if (r.echo) text = tokenizer.decode(ids);
    } else {
      return tl::unexpected(bad_request(
          "each prompt of a batch must be a string or a non-empty array of token ids", "prompt"));
    }
    if (fill_in) {
      // Prefix, suffix, middle (llama.cpp's /infill order): the model writes the middle.
      std::vector<TokenId> framed;
      if (vocab.add_bos && vocab.bos != kNoToken) framed.push_back(vocab.bos);
      framed.push_back(vocab.fim_pre);
      framed.insert(framed.end(), ids.begin(), ids.end());
      framed.push_back(vocab.fim_suf);
      const auto tail = tokenizer.encode(std::string(suffix->get_string()), false);
      framed.insert(framed.end(), tail.begin(), tail.end());
      framed.push_back(vocab.fim_mid);
      ids = std::move(framed);
    }
    // Echo shows the prompt the model was given: what truncation left of it.
    if (truncate_prompt(ids, truncation) && r.echo) text = tokenizer.decode(ids);
    if (ids.empty()) return tl::unexpected(bad_request("the prompt is empty", "prompt"));
    r.prompts.push_back(std::move(ids));
    r.prompt_texts.push_back(std::move(text));
  }
  r.generate.prompt = r.prompts.front();
  if (r.prompts.size() == 1) r.prompts.clear();  // one prompt: generate.prompt alone
  r.generate.params.max_tokens = 16;             // OpenAI's default for completions
  if (auto common = parse_common(o, context, r); !common) return tl::unexpected(common.error());
  TROUPE_API_TRY(const auto best_of, integer_in(o, "best_of", 1, 16));
  r.best_of = static_cast<std::int32_t>(best_of.value_or(r.n));
  if (r.score_only && r.best_of > r.n) {
    return tl::unexpected(bad_request(
        "'best_of' ranks generated tokens, and 'max_tokens' 0 generates none", "best_of"));
  }
  if (r.best_of < r.n) {
    return tl::unexpected(bad_request("'best_of' (" + std::to_string(r.best_of) +
                                          ") must be at least 'n' (" + std::to_string(r.n) + ")",
                                      "best_of"));
  }
  if (r.best_of > r.n && r.stream) {
    return tl::unexpected(
        bad_request("'best_of' greater than 'n' cannot be streamed: its choices are picked "
                    "once every candidate has ended",
                    "best_of"));
  }
  if (r.num_prompts() * r.best_of > kMostSequences) {
    return tl::unexpected(bad_request("a request may run at most " +
                                          std::to_string(kMostSequences) +
                                          " sequences: prompts x best_of (or n) is " +
                                          std::to_string(r.num_prompts() * r.best_of),
                                      r.prompts.empty() ? "best_of" : "prompt"));
  }
  // The prompt's own logprobs, returned before the output's, need the prompt positions.
  if (r.echo && r.want_logprobs && !r.generate.params.prompt_logprobs) {
    r.generate.params.prompt_logprobs = r.generate.params.logprobs;
  }
  // Candidates are ranked by their tokens' log-probabilities.
  if (r.best_of > r.n && !r.generate.params.logprobs) r.generate.params.logprobs = 0;
  return r;
}

// A chat body's messages (tools, documents, template kwargs) through the chat template,
// tokenized as a chat request's prompt is; `add_special` as /tokenize's add_special_tokens.
// `rendered`, when given, is set to the prompt's text.
tl::expected<std::vector<TokenId>, ApiError> chat_prompt_tokens(
    const json::object& o, const ApiContext& context, bool add_special = true,
    std::string* rendered_text = nullptr) {
  TROUPE_API_TRY(const text::ChatInput input, parse_chat_input(o));
  // The built-in renderers write the messages alone: documents would be dropped unseen.
  if (!input.documents.is_none() && !(context.chat_template && context.chat_template->is_jinja())) {
    return tl::unexpected(bad_request(
        "'documents' needs a Jinja chat template that reads them, and this server renders "
        "chats with its built-in fallback (give one with --chat-template)",
        "documents"));
  }
  static const text::ChatTemplate kChatml = text::ChatTemplate::create("", "", {});
  const auto rendered = (context.chat_template ? *context.chat_template : kChatml).render(input);
  // The template refused the conversation (its raise_exception) or failed on it.
  if (!rendered) return tl::unexpected(bad_request(rendered.error().message, "messages"));
  const std::string& prompt = *rendered;
  if (auto fits = check_prompt_bytes(prompt.size(), context, "messages"); !fits) {
    return tl::unexpected(fits.error());
  }
  if (rendered_text != nullptr) *rendered_text = prompt;
  return context.tokenizer->encode(prompt, add_special, /*parse_special=*/true);
}

// Whether the parser's markers are control tokens, which a skip_special_tokens output
// leaves out: gpt-oss's harmony markers always are; <think> is in some vocabularies.
bool reasoning_needs_special_tokens(text::ReasoningFormat format, const text::Vocabulary& vocab) {
  if (format == text::ReasoningFormat::gpt_oss) return true;
  for (const std::string_view marker : {"<think>", "</think>"}) {
    const TokenId id = vocab.find(marker);
    if (id != kNoToken && static_cast<std::size_t>(id) < vocab.types.size() &&
        vocab.types[static_cast<std::size_t>(id)] == text::TokenType::control) {
      return true;
    }
  }
  return false;
}

tl::expected<CompletionRequest, ApiError> chat_request(const json::object& o,
                                                       const ApiContext& context,
                                                       bool socket = false) {
  if (auto known = check_fields(o, true, socket); !known) return tl::unexpected(known.error());
  CompletionRequest r;
  r.chat = true;
  if (auto checked = check_model(o, context, r); !checked) return tl::unexpected(checked.error());
  TROUPE_API_TRY(const auto truncation, prompt_truncation(o, context));
  std::string prompt_text;
  TROUPE_API_TRY(r.generate.prompt,
                 chat_prompt_tokens(o, context, /*add_special=*/true, &prompt_text));
  truncate_prompt(r.generate.prompt, truncation);
  // Chat's default: whatever room the context leaves.
  r.generate.params.max_tokens = std::max<std::int32_t>(
      1, context.max_model_len - static_cast<std::int32_t>(r.generate.prompt.size()));
  if (auto common = parse_common(o, context, r); !common) return tl::unexpected(common.error());
  const bool constrained = !r.generate.params.grammar.empty();
  TROUPE_API_TRY(r.tools,
                 parse_tool_request(o, context.tool_call_format, r.generate.params.grammar));
  if (!constrained && !r.generate.params.grammar.empty()) r.grammar_param = "tools";
  TROUPE_API_TRY(const auto include_reasoning, boolean(o, "include_reasoning"));
  r.include_reasoning = include_reasoning.value_or(true);
  // An output constraint (a response_format, required tools) holds for the answer: from
  // the thinking's end marker on, as vLLM's, unless the prompt closed the thinking.
  if (context.reasoning_format) {
    r.reasoning.emplace(*context.reasoning_format, prompt_text);
    if (!r.generate.params.grammar.empty() && !r.reasoning->starts_in_answer()) {
      r.generate.params.grammar_after = context.tokenizer->encode(
          std::string(r.reasoning->answer_marker()), /*add_special=*/false, /*parse_special=*/true);
    }
    if (reasoning_needs_special_tokens(*context.reasoning_format,
                                       context.tokenizer->vocabulary())) {
      r.generate.skip_special_tokens = false;  // the parser reads the markers and drops them
    }
  }
  return r;
}

}  // namespace

tl::expected<CompletionRequest, ApiError> parse_completion_request(std::string_view body,
                                                                   const ApiContext& context) {
  TROUPE_API_TRY(const json::object o, parse_object(body));
  return completion_request(o, context);
}

tl::expected<CompletionRequest, ApiError> parse_chat_request(std::string_view body,
                                                             const ApiContext& context) {
  TROUPE_API_TRY(const json::object o, parse_object(body));
  return chat_request(o, context);
}

ApiContext make_api_context(const text::Tokenizer& tokenizer, std::int32_t max_model_len,
                            std::string served_model_name, std::string_view chat_template,
                            std::string chat_template_origin) {
  ApiContext context;
  context.tokenizer = &tokenizer;
  context.max_model_len = max_model_len;
  // Written into every answer: UTF-8 whatever the caller gave (troupe serve refuses any
  // other name at its flag).
  context.served_model_name = text::to_valid_utf8(served_model_name);
  const auto& vocabulary = tokenizer.vocabulary();
  text::ChatSpecialTokens special;
  auto token_text = [&](TokenId id) {
    return id >= 0 && static_cast<std::size_t>(id) < vocabulary.size()
               ? vocabulary.tokens[static_cast<std::size_t>(id)]
               : std::string();
  };
  special.bos_token = token_text(vocabulary.bos);
  special.eos_token = token_text(vocabulary.eos);
  special.tokenizer_adds_bos = vocabulary.add_bos;
  context.chat_template = std::make_shared<const text::ChatTemplate>(
      text::ChatTemplate::create(chat_template, std::move(chat_template_origin), special));
  // Each token's bytes, as the worker's runner reads them for its masks.
  std::vector<std::string> token_bytes(tokenizer.size());
  for (std::size_t id = 0; id < token_bytes.size(); ++id) {
    token_bytes[id] = std::string(tokenizer.piece(static_cast<TokenId>(id)));
  }
  context.token_masker = std::make_shared<const grammar::TokenMasker>(std::move(token_bytes));
  // A token stands for at most its vocabulary text (SentencePiece's "▁" is three bytes
  // for one space; byte-level BPE spells a byte in one or two) or its decoded piece;
  // an unknown token for one UTF-8 character.
  const auto& vocab = tokenizer.vocabulary();
  std::size_t most = 4;
  for (std::size_t id = 0; id < vocab.size(); ++id) {
    most = std::max({most, vocab.tokens[id].size(),
                     tokenizer.piece(static_cast<TokenId>(id), /*render_special=*/true).size()});
  }
  context.max_token_bytes = most;
  context.tool_call_format = detect_tool_call_format(chat_template);
  return context;
}

tl::expected<WebSocketMessage, WebSocketError> parse_websocket_message(std::string_view text,
                                                                       const ApiContext& context) {
  auto fail = [](std::string id, ApiError error) {
    return tl::unexpected(WebSocketError{std::move(id), std::move(error)});
  };
  auto parsed = parse_object(text);
  if (!parsed) return fail("", parsed.error());
  const json::object& o = *parsed;
  const auto* type = o.if_contains("type");
  const auto* id = o.if_contains("id");
  if (type == nullptr || !type->is_string() ||
      (type->get_string() != "generate" && type->get_string() != "cancel")) {
    const std::string known =
        id != nullptr && id->is_string() && id->get_string().size() <= kMostSocketIdBytes
            ? std::string(id->get_string())
            : "";
    return fail(known, bad_request("'type' must be \"generate\" or \"cancel\"", "type"));
  }
  if (id == nullptr || !id->is_string() || id->get_string().empty()) {
    return fail("", bad_request("'id' must be a non-empty string", "id"));
  }
  // Every frame of the request carries its id back.
  if (id->get_string().size() > kMostSocketIdBytes) {
    return fail("", bad_request("'id' may be at most " + std::to_string(kMostSocketIdBytes) +
                                    " bytes, not " + std::to_string(id->get_string().size()),
                                "id"));
  }
  WebSocketMessage m;
  m.type = std::string(type->get_string());
  m.id = std::string(id->get_string());
  if (m.type == "cancel") return m;
  // The parsed object decides: a generate with "messages" is a chat.
  auto request = o.contains("messages") ? chat_request(o, context, /*socket=*/true)
                                        : completion_request(o, context, /*socket=*/true);
  if (!request) return fail(m.id, request.error());
  // A socket's generate is one stream of one sequence's events (docs/websocket.md).
  const CompletionRequest& r = *request;
  if (r.num_prompts() > 1 || r.best_of > r.n || r.echo || r.want_prompt_logprobs) {
    const char* param = r.num_prompts() > 1 ? "prompt"
                        : r.best_of > r.n   ? "best_of"
                        : r.echo            ? "echo"
                                            : "prompt_logprobs";
    return fail(m.id, bad_request(std::string("'") + param +
                                      "' is not supported on the socket: one prompt, one "
                                      "sequence per generate (send several generates)",
                                  param));
  }
  m.request = std::move(*request);
  return m;
}

tl::expected<std::string, ApiError> tokenize_response(std::string_view body,
                                                      const ApiContext& context) {
  TROUPE_API_TRY(const json::object o, parse_object(body));
  TROUPE_API_TRY(const auto add_special, boolean(o, "add_special_tokens"));
  std::vector<TokenId> ids;
  if (const auto* messages = o.if_contains("messages"); messages != nullptr) {
    // vLLM's chat form: the tokens a chat request with these messages would be given.
    if (o.contains("prompt")) {
      return tl::unexpected(bad_request("give 'prompt' or 'messages', not both", "messages"));
    }
    TROUPE_API_TRY(ids, chat_prompt_tokens(o, context, add_special.value_or(true)));
  } else {
    const auto* prompt = o.if_contains("prompt");
    if (prompt == nullptr || !prompt->is_string()) {
      return tl::unexpected(
          bad_request("'prompt' must be a string (or give 'messages')", "prompt"));
    }
    // vLLM's /tokenize refuses a prompt longer than the context as well.
    if (auto fits = check_prompt_bytes(prompt->get_string().size(), context); !fits) {
      return tl::unexpected(fits.error());
    }
    ids = context.tokenizer->encode(std::string(prompt->get_string()), add_special.value_or(true));
  }
  json::array tokens;
  for (TokenId id : ids) tokens.emplace_back(id);
  return json::serialize(json::object{{"tokens", std::move(tokens)},
                                      {"count", ids.size()},
                                      {"max_model_len", context.max_model_len}});
}

tl::expected<std::string, ApiError> detokenize_response(std::string_view body,
                                                        const ApiContext& context) {
  TROUPE_API_TRY(const json::object o, parse_object(body));
  const auto* tokens = o.if_contains("tokens");
  if (tokens == nullptr || !tokens->is_array()) {
    return tl::unexpected(bad_request("'tokens' must be an array of token ids", "tokens"));
  }
  TROUPE_API_TRY(const auto ids, token_array(*tokens, "tokens", context.tokenizer->size()));
  return json::serialize(
      json::object{{"prompt", text::to_valid_utf8(context.tokenizer->decode(ids))}});
}

}  // namespace troupe::net
