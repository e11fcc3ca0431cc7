// The request actor: one per request. Turns token ids into text (UTF-8 safe),
// applies stop strings and the deadline, and hands events to the caller.
#pragma once

#include <memory>

#include "actors/messages.hpp"
#include "monitoring/metrics.hpp"
#include "text/incremental_detokenizer.hpp"
#include "text/stop_strings.hpp"
#include "text/tokenizer.hpp"

namespace troupe::actors {

struct RequestState {
  RequestId id = 0;
  TokenCallback on_event;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::unique_ptr<text::IncrementalDetokenizer> detokenizer;
  std::unique_ptr<text::StopStringFilter> stop;
  bool skip_special_tokens = true;          // GenerateRequest's
  bool include_stop_str_in_output = false;  // GenerateRequest's
  front_actor front;                        // where its aborts go
  request_actor keep_alive;                 // itself, until it ends: nobody else must hold it
  std::int32_t num_prompt_tokens = 0;
  std::int32_t num_generated = 0;
  std::int32_t num_cached_tokens = 0;
  bool done = false;
  std::shared_ptr<monitoring::Metrics> metrics;
  std::chrono::steady_clock::time_point submitted, first_token, last_token, first_scheduled;
  static inline const char* name = "troupe.request";
};

struct RequestSetup {
  RequestId id = 0;
  TokenCallback on_event;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;
  std::int32_t num_prompt_tokens = 0;
  std::chrono::milliseconds timeout{0};
  front_actor front;  // where its aborts go
  std::shared_ptr<monitoring::Metrics> metrics;
  std::chrono::steady_clock::time_point submitted;
};

request_actor::behavior_type request(request_actor::stateful_pointer<RequestState> self,
                                     std::shared_ptr<RequestSetup> setup);

}  // namespace troupe::actors
