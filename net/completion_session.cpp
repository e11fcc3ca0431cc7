// Generation over HTTP: a completion, chat completion or response parsed off the I/O
// thread, its output constraint checked, its sequences submitted to the engine, and its
// events answered as one JSON object or streamed as server-sent events.
#include <sys/socket.h>

#include <cerrno>

#include "net/cors.hpp"
#include "net/event_stream.hpp"
#include "net/generation_stream.hpp"
#include "net/responses_api.hpp"
#include "net/server_impl.hpp"
#include "net/structured_output.hpp"
#include "troupe/background_priority.hpp"

namespace troupe::net {

namespace {

std::int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// What the watch on a generation's socket and its coroutine share (on the strand).
struct Watch {
  std::shared_ptr<GenerationStream> generation;
  bool done = false;  // the answer is complete: stop watching
  bool client_gone = false;
};

// Watches the socket while a generation runs: EOF or a reset means the client is gone,
// and its requests are cancelled now instead of when the answer cannot be written.
// Bytes from the client (its next request, pipelined) mean it is still there.
void watch_for_disconnect(tcp::socket& socket, std::shared_ptr<Watch> w) {
  // The socket outlives every completion but a cancelled one, which touches nothing.
  auto on_readable = [&socket, w](error_code ec) {
    if (ec || w->done) return;  // cancelled: the answer is complete, or the socket closed
    char byte = 0;
    const auto n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      watch_for_disconnect(socket, w);
      return;
    }
    w->client_gone = true;
    w->generation->cancel();
  };
  socket.async_wait(tcp::socket::wait_read, std::move(on_readable));
}

}  // namespace

asio::awaitable<std::optional<ApiError>> HttpServer::Impl::check_constraint(
    const CompletionRequest& request) {
  if (request.generate.params.grammar.empty() || !context.token_masker) co_return std::nullopt;
  std::function<std::string()> probe = [this, &request]() -> std::string {
    static thread_local const bool lowered = (lower_this_thread_priority(), true);
    (void)lowered;
    try {
      return first_mask_refusal(request.generate.params.grammar, *context.token_masker);
    } catch (const std::exception& e) {
      return e.what();
    }
  };
  std::string why = co_await run_on(grammar_pool, std::move(probe));
  if (why.empty()) co_return std::nullopt;
  co_return bad_request("'" + request.grammar_param + "': " + why, request.grammar_param);
}

asio::awaitable<bool> HttpServer::Impl::completions(ServerStream& stream, Request& request,
                                                    AccessEntry& entry) {
  const RouteKind kind = route_kind(request);
  const bool chat = kind == RouteKind::chat_completion;
  using Parsed = tl::expected<CompletionRequest, ApiError>;
  std::function<Parsed()> parse = [this, &request, kind]() -> Parsed {
    try {
      return kind == RouteKind::responses ? parse_responses_request(request.body(), context)
             : kind == RouteKind::chat_completion
                 ? parse_chat_request(request.body(), context)
                 : parse_completion_request(request.body(), context);
    } catch (const std::exception& e) {
      return tl::unexpected(ApiError{500, e.what(), "internal_error", ""});
    }
  };
  Parsed parsed = co_await run_on(tokenizer_pool, std::move(parse));
  if (!parsed) {
    const bool alive = co_await refuse(stream, request, parsed.error(), entry);
    co_return alive;
  }
  const std::optional<ApiError> costly = co_await check_constraint(*parsed);
  if (costly) {
    const bool alive = co_await refuse(stream, request, *costly, entry);
    co_return alive;
  }
  const CompletionRequest& completion = *parsed;
  const std::string id = (completion.responses() ? "resp_"
                          : chat                 ? "chatcmpl-"
                                                 : "cmpl-") +
                         std::to_string(next_completion.fetch_add(1));
  const std::int64_t created = unix_time();
  if (entry.request_id.empty()) entry.request_id = id;  // else the client's X-Request-Id
  entry.prompt_tokens = 0;
  for (int p = 0; p < completion.num_prompts(); ++p) {
    entry.prompt_tokens += static_cast<std::int64_t>(completion.prompt(p).size());
  }
  const int per_prompt = completion.sequences_per_prompt();
  const int num_sequences = completion.num_prompts() * per_prompt;

  // Admitted and submitted; the engine's events come back on this coroutine's strand.
  GenerationStream::Options options;
  options.streamed = completion.stream;
  options.output = std::make_shared<OutputBound>(config.max_buffered_output_bytes);
  options.busy_message = "the server has " + std::to_string(config.max_concurrent_requests) +
                         " requests in flight: try again later";
  options.on_overflow = [this, &stream] {  // detached before the stream is gone
    if (config.metrics) config.metrics->count_connection_error("slow_reader");
    stream.cancel();
  };
  auto strand = co_await asio::this_coro::executor;
  auto started = GenerationStream::start({engine, gate, admission, drain}, completion,
                                         std::move(options), strand);
  if (!started) {
    const ApiError refused = started.error();
    const bool alive = co_await refuse(stream, request, refused, entry);
    co_return alive;
  }
  const std::shared_ptr<GenerationStream> generation = *started;
  struct Detach {  // its overflow may come after this coroutine: it must not see the stream
    GenerationStream& generation;
    ~Detach() {
      generation.detach();
      generation.finished();  // its answer is written, or never will be
    }
  } detach{*generation};
  auto watch = std::make_shared<Watch>(Watch{generation});
  watch_for_disconnect(stream.socket(), watch);
  auto stop_watching = [&watch, &stream] {
    watch->done = true;
    error_code ignored;
    stream.socket().cancel(ignored);
  };

  if (!completion.stream) {
    std::vector<CompletionOutput> outputs(static_cast<std::size_t>(num_sequences));
    for (int s = 0; s < num_sequences; ++s) {
      outputs[static_cast<std::size_t>(s)].prompt_index = static_cast<std::size_t>(s / per_prompt);
    }
    std::optional<ApiError> failure;
    while (!generation->over()) {
      std::optional<ChoiceEvent> next = co_await generation->next(entry);
      if (!next) break;
      generation->taken(*next);
      TokenEvent& event = next->event;
      CompletionOutput& output = outputs[static_cast<std::size_t>(next->index)];
      output.text += event.text;
      if (!event.prompt_logprobs.empty()) output.prompt_logprobs = std::move(event.prompt_logprobs);
      if (event.token != kNoToken) output.cumulative_logprob += event.logprob;
      if (event.token != kNoToken && completion.want_logprobs) output.tokens.push_back(event);
      if (event.finished) {
        if (event.finish_reason == FinishReason::error) failure = api_error(event);
        output.end = std::move(event);
      }
    }
    stop_watching();
    if (watch->client_gone || generation->over()) {
      entry.client_gone = true;
      entry.status = 499;  // nginx's "client closed request": no answer was sent
      generation->close();
      co_return false;
    }
    if (failure) {
      const bool alive = co_await refuse(stream, request, *failure, entry);
      co_return alive;
    }
    std::string body = completion.responses()
                           ? responses_response(context, id, created, completion, outputs.front())
                           : completion_response(context, id, created, completion,
                                                 best_choices(completion, std::move(outputs)));
    auto response = make_response(request, http::status::ok, std::move(body));
    count(request, 200, entry);
    add_cors_headers(request, response, config.cors);
    add_request_id_header(response, entry);
    const bool alive = co_await write_response(stream, std::move(response), config.write_timeout);
    co_return alive;
  }

  // Server-sent events: one chunk per event, then usage and [DONE] after the last choice.
  EventStreamWriter sse(stream, request, config.write_timeout);
  count(request, 200, entry);
  bool alive = co_await sse.head(request, config.cors, entry, request.keep_alive());
  std::string data;
  // A response streams its own events (net/responses_api.hpp), opened by response.created.
  std::optional<ResponsesStream> responses;
  if (completion.responses()) responses.emplace(context, id, created, completion);
  if (alive && responses) {
    data = responses->start();
    alive = co_await sse.write(data);
  } else if (alive && completion.chat) {  // a chat stream opens each choice with its role
    data.clear();
    for (int i = 0; i < num_sequences; ++i) {
      data += "data: " + chat_role_chunk(context, completion, id, created, i) + "\n\n";
    }
    alive = co_await sse.write(data);
  }
  Usage usage;
  // echo: a choice's prompt goes out before its first token (with the prompt's logprobs,
  // which come with that first event).
  std::vector<bool> echoed(static_cast<std::size_t>(num_sequences), !completion.echo);
  std::vector<std::size_t> sent_bytes(static_cast<std::size_t>(num_sequences), 0);  // text_offset
  while (alive && !generation->over()) {
    std::optional<ChoiceEvent> next = co_await generation->next(entry);
    if (!next) break;
    const int index = next->index;
    TokenEvent& event = next->event;
    data.clear();
    if (responses) {  // one sequence: its events say all, with no [DONE] after them
      data = responses->take(event);
      if (!data.empty()) alive = co_await sse.write(data);
      generation->taken(*next);
      continue;
    }
    if (!echoed[static_cast<std::size_t>(index)]) {
      echoed[static_cast<std::size_t>(index)] = true;
      const auto prompt_index = static_cast<std::size_t>(index / per_prompt);
      data +=
          "data: " +
          echo_chunk(context, id, created, completion, prompt_index, event.prompt_logprobs, index) +
          "\n\n";
      sent_bytes[static_cast<std::size_t>(index)] = completion.prompt_texts[prompt_index].size();
    }
    const bool called = next->called;
    bool thought_only = false;  // the event's text was all thinking: its chunk carries it
    if (next->read) {           // a read chat: what its text let out now (the rest is held back)
      const ChoiceText& shown = *next->read;
      if (!shown.reasoning.empty()) {
        data +=
            "data: " + reasoning_chunk(context, completion, id, created, shown.reasoning, index) +
            "\n\n";
      }
      if (!shown.deltas.empty()) {
        data += "data: " + tool_calls_chunk(context, completion, id, created, shown.deltas, index) +
                "\n\n";
      }
      if (!called && !event.finished && event.text.empty() && !completion.want_logprobs) {
        if (data.empty()) {
          generation->taken(*next);
          continue;  // held: nothing to send yet
        }
        thought_only = true;
      }
    }
    if (!thought_only) {
      data += "data: " +
              completion_chunk(context, id, created, completion, event, index, called,
                               sent_bytes[static_cast<std::size_t>(index)]) +
              "\n\n";
    }
    sent_bytes[static_cast<std::size_t>(index)] += event.text.size();
    if (event.finished) {
      usage.completion_tokens += event.num_generated_tokens;
      if (index % per_prompt == 0) {  // each prompt once
        usage.prompt_tokens += event.num_prompt_tokens;
        usage.cached_tokens += event.num_cached_tokens;
      }
      // Cut short by a failure (a lost node mid-stream): the client hears why, as an
      // error event after the choice's last chunk (finish_reason "error").
      if (event.finish_reason == FinishReason::error) {
        data += "data: " + error_json(api_error(event)) + "\n\n";
      }
      const bool last = generation->num_open() == 0;
      if (last && completion.include_usage) {
        data += "data: " + usage_chunk(context, id, created, completion, usage) + "\n\n";
      }
      if (last) data += "data: [DONE]\n\n";
    }
    // A client that went away is seen when a write fails (or by the watch): cancel then.
    alive = co_await sse.write(data);
    generation->taken(*next);
  }
  stop_watching();
  if (!alive || watch->client_gone || generation->over()) {
    entry.client_gone = true;
    generation->cancel();
    generation->close();
    co_return false;
  }
  const bool finished = co_await sse.finish();  // HTTP/1.0: the close ends the body
  co_return finished&& request.keep_alive();
}

}  // namespace troupe::net
