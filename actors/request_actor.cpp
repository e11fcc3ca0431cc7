#include "actors/request_actor.hpp"
#include "monitoring/log.hpp"

#include <cstdio>

namespace troupe::actors {

namespace {

using Self = request_actor::stateful_pointer<RequestState>;

// The caller's callback must not let an exception escape into the actor.
void deliver(RequestState& state, const TokenEvent& event) {
  try {
    state.on_event(event);
  } catch (const std::exception& e) {
    monitoring::logf(monitoring::LogLevel::warning, "request %llu: the event callback threw: %s",
                     static_cast<unsigned long long>(state.id), e.what());
  } catch (...) {
    monitoring::logf(monitoring::LogLevel::warning, "request %llu: the event callback threw",
                     static_cast<unsigned long long>(state.id));
  }
}

// The text the stop strings let out of `text`; the stop string itself too when the request
// asked for it (include_stop_str_in_output).
std::string shown(RequestState& state, std::string_view text) {
  const bool was_stopped = state.stop->stopped();
  std::string out = state.stop->push(text);
  if (!was_stopped && state.stop->stopped() && state.include_stop_str_in_output) {
    out += state.stop->matched();
  }
  return out;
}

// The last event: whatever text was held, the reason and the counts.
void finish(Self self, TokenEvent event, FinishReason reason, const std::string& error = {},
            ErrorCode error_code = ErrorCode::internal) {
  auto& state = self->state;
  if (!state.stop->stopped()) {
    event.text += shown(state, state.detokenizer->flush());
    if (!state.stop->stopped()) event.text += state.stop->flush();
  }
  event.finished = true;
  event.finish_reason = state.stop->stopped() ? FinishReason::stop : reason;
  event.error = error;
  event.error_code = error_code;
  event.num_prompt_tokens = state.num_prompt_tokens;
  event.num_cached_tokens = state.num_cached_tokens;
  event.num_generated_tokens = state.num_generated;
  state.done = true;
  if (state.metrics) {
    using seconds = std::chrono::duration<double>;
    const auto now = std::chrono::steady_clock::now();
    const bool has_tokens = state.num_generated > 0;
    const double ttft = has_tokens ? seconds(state.first_token - state.submitted).count() : 0.0;
    const double tpot =
        state.num_generated > 1
            ? seconds(state.last_token - state.first_token).count() / (state.num_generated - 1)
            : 0.0;
    state.metrics->observe_request(finish_reason_name(event.finish_reason),
                                   seconds(now - state.submitted).count(), ttft, tpot, has_tokens);
    state.metrics->observe_request_tokens(state.num_prompt_tokens, state.num_generated);
    if (has_tokens && state.first_scheduled.time_since_epoch().count() != 0) {
      state.metrics->observe_phases(seconds(state.first_token - state.first_scheduled).count(),
                                    seconds(state.last_token - state.first_token).count());
    }
  }
  deliver(state, event);
  state.keep_alive = nullptr;
  self->quit();
}

void on_token(Self self, engine::RequestEvent& update) {
  auto& state = self->state;
  if (state.done) return;
  state.num_cached_tokens = std::max(state.num_cached_tokens, update.num_cached_tokens);
  if (update.first_scheduled.time_since_epoch().count() != 0 &&
      state.first_scheduled.time_since_epoch().count() == 0) {
    state.first_scheduled = update.first_scheduled;
    if (state.metrics) {
      state.metrics->observe_queue_time(
          std::chrono::duration<double>(state.first_scheduled - state.submitted).count());
    }
  }
  TokenEvent event;
  event.request_id = state.id;
  // Only the request's first event carries them (EngineCore attaches them once).
  event.prompt_logprobs = std::move(update.prompt_logprobs);
  if (update.token.id != kNoToken) {
    const auto now = std::chrono::steady_clock::now();
    if (state.num_generated == 0) {
      state.first_token = now;
    } else if (state.metrics) {
      state.metrics->observe_inter_token(
          std::chrono::duration<double>(now - state.last_token).count());
    }
    state.last_token = now;
    ++state.num_generated;
    event.token = update.token.id;
    event.logprob = update.token.logprob;
    event.top_logprobs = update.token.top_logprobs;
    // A control token shows unless skip_special_tokens; the EOS or stop token that ends
    // the sequence only with include_stop_str_in_output.
    const bool ends_here = update.finish_reason == FinishReason::stop;
    const bool render =
        !state.skip_special_tokens && (!ends_here || state.include_stop_str_in_output);
    event.text = shown(state, state.detokenizer->push(update.token.id, render));
    if (state.stop->stopped()) {
      // A stop string: the sequence ends here, whatever the scheduler planned.
      self->send(state.front, abort_atom::value, state.id, FinishReason::stop);
      finish(self, std::move(event), FinishReason::stop);
      return;
    }
  }
  if (update.finish_reason != FinishReason::none) {
    finish(self, std::move(event), update.finish_reason, update.error, update.error_code);
    return;
  }
  deliver(state, event);
}

}  // namespace

request_actor::behavior_type request(request_actor::stateful_pointer<RequestState> self,
                                     std::shared_ptr<RequestSetup> setup) {
  auto& state = self->state;
  state.id = setup->id;
  state.on_event = std::move(setup->on_event);
  state.tokenizer = setup->tokenizer;
  state.detokenizer = std::make_unique<text::IncrementalDetokenizer>(*state.tokenizer);
  state.stop = std::make_unique<text::StopStringFilter>(setup->stop);
  state.skip_special_tokens = setup->skip_special_tokens;
  state.include_stop_str_in_output = setup->include_stop_str_in_output;
  state.front = setup->front;
  state.num_prompt_tokens = setup->num_prompt_tokens;
  state.metrics = setup->metrics;
  state.submitted = setup->submitted;
  state.keep_alive = caf::actor_cast<request_actor>(self);
  if (setup->timeout.count() > 0) self->delayed_send(self, setup->timeout, timeout_atom::value);
  return {
      [self](token_atom, engine::RequestEvent& update) { on_token(self, update); },
      [self](timeout_atom) {
        if (self->state.done) return;
        self->send(self->state.front, abort_atom::value, self->state.id, FinishReason::timeout);
        TokenEvent event;
        event.request_id = self->state.id;
        finish(self, std::move(event), FinishReason::timeout);
      },
  };
}

}  // namespace troupe::actors
