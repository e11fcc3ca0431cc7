#include "net/generation_stream.hpp"

namespace troupe::net {

GenerationStream::GenerationStream(const Shared& shared, const CompletionRequest& request,
                                   Options options, asio::any_io_executor strand)
    : shared_(shared),
      options_(std::move(options)),
      strand_(std::move(strand)),
      channel_(std::make_shared<EventChannel>(strand_, 1024)),
      score_only_(request.score_only) {}

tl::expected<std::shared_ptr<GenerationStream>, ApiError> GenerationStream::start(
    const Shared& shared, const CompletionRequest& request, Options options,
    asio::any_io_executor strand) {
  const bool streamed = options.streamed;
  std::shared_ptr<GenerationStream> stream;
  {
    // Under the drain's lock: once the drain has started no stream joins its live set,
    // so the cut at its timeout misses none.
    std::lock_guard lock(shared.drain->mutex);
    if (shared.drain->draining) {
      return tl::unexpected(ApiError{503,
                                     "the server is shutting down and takes no new requests: "
                                     "try again (another server) shortly",
                                     "service_unavailable", "", kDrainRetryAfterSeconds});
    }
    // Admission: past the limit, the client should come back later.
    if (!shared.admission->try_acquire()) {
      return tl::unexpected(ApiError{429, options.busy_message, "rate_limit_error", ""});
    }
    stream =
        std::make_shared<GenerationStream>(shared, request, std::move(options), std::move(strand));
    shared.drain->live.emplace(stream.get(), stream);
    stream->registered_ = true;
  }
  // Sequences run prompt-major. A chat whose text is read (thinking apart, tool calls)
  // holds back what may be a marker or a call while it streams: a call until its choice
  // ends.
  const int per_prompt = request.sequences_per_prompt();
  const int num_sequences = request.num_prompts() * per_prompt;
  if (streamed && request.chat && !request.responses() && ChoiceTextStream(request).reads()) {
    stream->reads_.assign(static_cast<std::size_t>(num_sequences), ChoiceTextStream(request));
  }
  stream->num_running_ = num_sequences;
  stream->num_open_ = num_sequences;
  TokenCallback on_event = [stream](const TokenEvent& e) { stream->on_event(e); };
  // Each choice (or candidate) is an engine request of its prompt; their events share the
  // channel. A prompt's i-th sequence has the seed plus i, as it would alone.
  for (int s = 0; s < num_sequences; ++s) {
    GenerateRequest generate = request.generate;
    const int i = s % per_prompt;
    if (request.num_prompts() > 1) {
      generate.prompt = request.prompt(static_cast<std::size_t>(s / per_prompt));
    }
    if (generate.params.seed && i > 0) *generate.params.seed += static_cast<std::uint64_t>(i);
    auto submitted = shared.engine.submit(std::move(generate), on_event);
    if (!submitted) {
      stream->cancel();
      stream->finished();
      // The sequences never submitted will never end: give their share back now.
      if (stream->num_running_.fetch_sub(num_sequences - s) == num_sequences - s) {
        shared.admission->release();
      }
      return tl::unexpected(api_error(submitted.error()));
    }
    stream->ids_.push_back(*submitted);
  }
  return stream;
}

void GenerationStream::on_event(const TokenEvent& e) {
  // The slot is freed when the request ends here, in the engine, not when written.
  if (e.finished && num_running_.fetch_sub(1) == 1) shared_.admission->release();
  // Once the server has stopped (the gate shut) nothing of it is touched.
  std::lock_guard lock(shared_.gate->mutex);
  if (!shared_.gate->open) return;
  if (options_.output->add(event_bytes(e))) {
    // The client has fallen too far behind: cancel and close on its strand.
    asio::post(strand_, [self = shared_from_this()] { self->overflowed(); });
  }
  // Past the bound only a choice's end is queued still: what became of it is logged.
  if (options_.output->over() && !e.finished) return;
  if (!channel_->try_send(error_code{}, e)) {
    channel_->async_send(error_code{}, e, [](error_code) {});
  }
}

void GenerationStream::overflowed() {
  cancel();
  if (options_.on_overflow) options_.on_overflow();
}

void GenerationStream::cancel() {
  for (RequestId id : ids_) shared_.engine.cancel(id);
}

void GenerationStream::cut() {
  cut_ = true;
  cancel();
}

void GenerationStream::finished() {
  if (!registered_.exchange(false)) return;
  std::lock_guard lock(shared_.drain->mutex);
  shared_.drain->live.erase(this);
}

void GenerationStream::close() {
  channel_->close();
}

asio::awaitable<std::optional<ChoiceEvent>> GenerationStream::next(AccessEntry& entry) {
  if (num_open_ == 0) co_return std::nullopt;
  auto [ec, event] = co_await channel_->async_receive(kUseTuple);
  if (ec) co_return std::nullopt;  // closed
  ChoiceEvent out;
  out.bytes = event_bytes(event);
  out.index =
      static_cast<int>(std::find(ids_.begin(), ids_.end(), event.request_id) - ids_.begin());
  if (score_only_) drop_scoring_token(event);
  if (cut_ && event.finished && event.finish_reason == FinishReason::abort) {
    // Cancelled by the drain's end, not by its client: the client hears why.
    event.finish_reason = FinishReason::error;
    event.error_code = ErrorCode::unavailable;
    event.error = "the server shut down before this request ended (--shutdown-timeout)";
  }
  if (event.token != kNoToken) entry.first_token();
  if (!reads_.empty()) {
    ChoiceText shown = reads_[static_cast<std::size_t>(out.index)].take(event.text, event.finished);
    event.text = shown.content;
    out.called = !shown.calls.empty();
    out.read = std::move(shown);
  }
  if (event.finished) {
    --num_open_;
    entry.ended(event, openai_finish_reason(event.finish_reason, out.called));
  }
  out.event = std::move(event);
  co_return out;
}

}  // namespace troupe::net
