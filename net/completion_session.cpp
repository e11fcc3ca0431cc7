// Generation over HTTP: a completion, chat completion or response parsed off the I/O
// thread, its output constraint checked, its sequences submitted to the engine, and its
// events answered as one JSON object or streamed as server-sent events.
#include <sys/socket.h>

#include <cerrno>

#include "net/choice_text.hpp"
#include "net/cors.hpp"
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

// One generation over HTTP: what its engine callbacks and its connection share.
struct Generation {
  std::shared_ptr<EventChannel> channel;
  std::shared_ptr<Admission> admission;
  std::atomic<int> num_open{0};  // choices not yet ended in the engine
  OutputBound output;
  // Touched on the connection's strand only.
  std::vector<RequestId> ids;
  ServerStream* stream = nullptr;  // while the coroutine holds it
  bool done = false;               // the answer is complete: stop watching
  bool client_gone = false;

  explicit Generation(std::size_t max_output) : output(max_output) {}
};

// Cancels every request of a generation (on its strand).
void cancel_all(Engine& engine, Generation& g) {
  for (RequestId id : g.ids) engine.cancel(id);
}

// Watches the socket while a generation runs: EOF or a reset means the client is gone,
// and its requests are cancelled now instead of when the answer cannot be written.
// Bytes from the client (its next request, pipelined) mean it is still there.
void watch_for_disconnect(Engine& engine, tcp::socket& socket, std::shared_ptr<Generation> g) {
  // The socket outlives every completion but a cancelled one, which touches nothing.
  auto on_readable = [&engine, &socket, g](error_code ec) {
    if (ec || g->done) return;  // cancelled: the answer is complete, or the socket closed
    char byte = 0;
    const auto n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      watch_for_disconnect(engine, socket, g);
      return;
    }
    g->client_gone = true;
    cancel_all(engine, *g);
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
  // Sequences run, prompt-major.
  const int per_prompt = completion.sequences_per_prompt();
  const int num_sequences = completion.num_prompts() * per_prompt;

  // Admission: past the limit, the client should come back later.
  if (!admission->try_acquire()) {
    const ApiError busy{429,
                        "the server has " + std::to_string(config.max_concurrent_requests) +
                            " requests in flight: try again later",
                        "rate_limit_error", ""};
    const bool alive = co_await refuse(stream, request, busy, entry);
    co_return alive;
  }

  // Engine events cross into this coroutine through a channel; the engine never blocks.
  auto g = std::make_shared<Generation>(config.max_buffered_output_bytes);
  g->channel = std::make_shared<EventChannel>(co_await asio::this_coro::executor, 1024);
  g->admission = admission;
  g->num_open = num_sequences;
  g->stream = &stream;
  struct Detach {  // the callbacks may outlive this coroutine: they must not see the stream
    Generation& g;
    ~Detach() { g.stream = nullptr; }
  } detach{*g};
  auto strand = co_await asio::this_coro::executor;
  TokenCallback on_event = [g, gate = gate, strand, this](const TokenEvent& e) {
    // The slot is freed when the request ends here, in the engine, not when written.
    if (e.finished && g->num_open.fetch_sub(1) == 1) g->admission->release();
    std::lock_guard lock(gate->mutex);
    if (!gate->open) return;
    if (g->output.add(event_bytes(e))) {
      // The client has fallen too far behind: cancel and close on its strand.
      asio::post(strand, [g, this] {
        if (config.metrics) config.metrics->count_connection_error("slow_reader");
        cancel_all(engine, *g);
        if (g->stream != nullptr) g->stream->cancel();
      });
    }
    if (g->output.over()) return;
    if (!g->channel->try_send(error_code{}, e))
      g->channel->async_send(error_code{}, e, [](error_code) {});
  };
  // Each choice (or candidate) is an engine request of its prompt; their events share the
  // channel. A prompt's i-th sequence has the seed plus i, as it would alone.
  for (int s = 0; s < num_sequences; ++s) {
    GenerateRequest generate = completion.generate;
    const int i = s % per_prompt;
    if (completion.num_prompts() > 1) {
      generate.prompt = completion.prompt(static_cast<std::size_t>(s / per_prompt));
    }
    if (generate.params.seed && i > 0) *generate.params.seed += static_cast<std::uint64_t>(i);
    auto submitted = engine.submit(std::move(generate), on_event);
    if (!submitted) {
      cancel_all(engine, *g);
      // The sequences never submitted will never end: give their share back now.
      if (g->num_open.fetch_sub(num_sequences - s) == num_sequences - s) admission->release();
      const ApiError refused = api_error(submitted.error());
      const bool alive = co_await refuse(stream, request, refused, entry);
      co_return alive;
    }
    g->ids.push_back(*submitted);
  }
  auto index_of = [&g](RequestId rid) {
    return static_cast<int>(std::find(g->ids.begin(), g->ids.end(), rid) - g->ids.begin());
  };
  watch_for_disconnect(engine, stream.socket(), g);
  auto stop_watching = [&g, &stream] {
    g->done = true;
    error_code ignored;
    stream.socket().cancel(ignored);
  };
  int num_open = num_sequences;

  if (!completion.stream) {
    std::vector<CompletionOutput> outputs(static_cast<std::size_t>(num_sequences));
    for (int s = 0; s < num_sequences; ++s) {
      outputs[static_cast<std::size_t>(s)].prompt_index = static_cast<std::size_t>(s / per_prompt);
    }
    std::optional<ApiError> failure;
    while (num_open > 0 && !g->output.over()) {
      auto [ec, event] = co_await g->channel->async_receive(kUseTuple);
      if (ec) break;
      g->output.remove(event_bytes(event));
      if (completion.score_only) drop_scoring_token(event);
      CompletionOutput& output = outputs[index_of(event.request_id)];
      output.text += event.text;
      if (!event.prompt_logprobs.empty()) output.prompt_logprobs = std::move(event.prompt_logprobs);
      if (event.token != kNoToken) {
        entry.first_token();
        output.cumulative_logprob += event.logprob;
      }
      if (event.token != kNoToken && completion.want_logprobs) output.tokens.push_back(event);
      if (event.finished) {
        entry.ended(event, openai_finish_reason(event.finish_reason));
        if (event.finish_reason == FinishReason::error) failure = api_error(event);
        output.end = std::move(event);
        --num_open;
      }
    }
    stop_watching();
    if (g->client_gone || g->output.over()) {
      entry.client_gone = true;
      entry.status = 499;  // nginx's "client closed request": no answer was sent
      g->channel->close();
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
  // HTTP/1.0 has no chunked encoding: its stream is the body up to the connection's close.
  const bool chunked = request.version() >= 11;
  http::response<http::empty_body> head{http::status::ok, request.version()};
  head.set(http::field::server, "troupe");
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  head.chunked(chunked);
  head.keep_alive(chunked && request.keep_alive());
  add_cors_headers(request, head, config.cors);
  add_request_id_header(head, entry);
  http::response_serializer<http::empty_body> serializer{head};
  count(request, 200, entry);
  stream.expires_after(config.write_timeout);
  auto [head_ec, head_n] = co_await http::async_write_header(stream, serializer, kUseTuple);
  bool alive = !head_ec;
  std::string data;
  auto write_data = [&]() -> asio::awaitable<bool> {
    stream.expires_after(config.write_timeout);
    if (chunked) {
      const auto chunk = http::make_chunk(asio::buffer(data));
      auto [wec, wn] = co_await asio::async_write(stream, chunk, kUseTuple);
      co_return !wec;
    }
    auto [wec, wn] = co_await asio::async_write(stream, asio::buffer(data), kUseTuple);
    co_return !wec;
  };
  // A response streams its own events (net/responses_api.hpp), opened by response.created.
  std::optional<ResponsesStream> responses;
  if (completion.responses()) responses.emplace(context, id, created, completion);
  if (alive && responses) {
    data = responses->start();
    alive = co_await write_data();
  } else if (alive && completion.chat) {  // a chat stream opens each choice with its role
    data.clear();
    for (int i = 0; i < num_sequences; ++i) {
      data += "data: " + chat_role_chunk(context, id, created, i) + "\n\n";
    }
    alive = co_await write_data();
  }
  Usage usage;
  // A chat whose text is read (thinking apart, tool calls) holds back what may be a marker
  // or a call: a call until its choice ends.
  std::vector<ChoiceTextStream> reads;
  if (completion.chat && !responses && ChoiceTextStream(completion).reads()) {
    reads.assign(static_cast<std::size_t>(num_sequences), ChoiceTextStream(completion));
  }
  // echo: a choice's prompt goes out before its first token (with the prompt's logprobs,
  // which come with that first event).
  std::vector<bool> echoed(static_cast<std::size_t>(num_sequences), !completion.echo);
  std::vector<std::size_t> sent_bytes(static_cast<std::size_t>(num_sequences), 0);  // text_offset
  while (alive && num_open > 0 && !g->output.over()) {
    auto [ec, event] = co_await g->channel->async_receive(kUseTuple);
    if (ec) break;
    const int index = index_of(event.request_id);
    const std::size_t bytes = event_bytes(event);
    if (completion.score_only) drop_scoring_token(event);
    if (event.token != kNoToken) entry.first_token();
    data.clear();
    if (responses) {  // one sequence: its events say all, with no [DONE] after them
      data = responses->take(event);
      if (event.finished) {
        --num_open;
        entry.ended(event, openai_finish_reason(event.finish_reason));
      }
      if (!data.empty()) alive = co_await write_data();
      g->output.remove(bytes);
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
    bool called = false;
    bool thought_only = false;  // the event's text was all thinking: its chunk carries it
    if (!reads.empty()) {
      ChoiceText shown = reads[static_cast<std::size_t>(index)].take(event.text, event.finished);
      event.text = std::move(shown.content);
      called = !shown.calls.empty();
      if (!shown.reasoning.empty()) {
        data += "data: " + reasoning_chunk(context, id, created, shown.reasoning, index) + "\n\n";
      }
      if (!shown.deltas.empty()) {
        data += "data: " + tool_calls_chunk(context, id, created, shown.deltas, index) + "\n\n";
      }
      if (!called && !event.finished && event.text.empty() && !completion.want_logprobs) {
        if (data.empty()) {
          g->output.remove(bytes);
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
      --num_open;
      usage.completion_tokens += event.num_generated_tokens;
      if (index % per_prompt == 0) {  // each prompt once
        usage.prompt_tokens += event.num_prompt_tokens;
        usage.cached_tokens += event.num_cached_tokens;
      }
      entry.ended(event, openai_finish_reason(event.finish_reason, called));
      // Cut short by a failure (a lost node mid-stream): the client hears why, as an
      // error event after the choice's last chunk (finish_reason "error").
      if (event.finish_reason == FinishReason::error) {
        data += "data: " + error_json(api_error(event)) + "\n\n";
      }
      if (num_open == 0 && completion.include_usage) {
        data += "data: " + usage_chunk(context, id, created, completion, usage) + "\n\n";
      }
      if (num_open == 0) data += "data: [DONE]\n\n";
    }
    // A client that went away is seen when a write fails (or by the watch): cancel then.
    alive = co_await write_data();
    g->output.remove(bytes);
  }
  stop_watching();
  if (!alive || g->client_gone || g->output.over()) {
    entry.client_gone = true;
    cancel_all(engine, *g);
    g->channel->close();
    co_return false;
  }
  if (!chunked) co_return false;  // the close ends the body
  stream.expires_after(config.write_timeout);
  const auto last = http::make_chunk_last();
  auto [lec, ln] = co_await asio::async_write(stream, last, kUseTuple);
  co_return !lec && request.keep_alive();
}

}  // namespace troupe::net
