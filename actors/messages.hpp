// The actors' vocabulary: atoms, message types and the three actor interfaces.
#pragma once

#include <caf/all.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "model/model_runner.hpp"
#include "model/step_input.hpp"
#include "troupe/engine.hpp"

namespace troupe::actors {

using step_atom = caf::atom_constant<caf::atom("step")>;
using submit_atom = caf::atom_constant<caf::atom("submit")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using token_atom = caf::atom_constant<caf::atom("token")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using timeout_atom = caf::atom_constant<caf::atom("timeout")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;

// A sequence the worker has not seen: its sampler is made from these.
struct NewSequence {
  std::uint64_t id = 0;
  SamplingParams params;
  std::vector<TokenId> prompt;
};

// One iteration's work for the worker.
struct StepWork {
  model::StepInput step;
  std::vector<std::uint64_t> sampled_ids;  // [num_logits] the sequence of each logit row
  std::vector<NewSequence> new_sequences;
  std::vector<std::uint64_t> removed;  // finished or aborted since the last step
};

struct StepOutput {
  std::vector<model::StepResult> results;  // one per logit row
  std::string error;                       // non-empty: the step failed
  bool worker_broken = false;              // an exception: the worker must be replaced
  double seconds = 0.0;
};

using StepWorkPtr = std::shared_ptr<const StepWork>;
using StepOutputPtr = std::shared_ptr<const StepOutput>;

// What the scheduler tells a request actor: a token, or the end without one.
struct TokenUpdate {
  TokenId token = kNoToken;
  float logprob = 0.0f;
  std::vector<TokenLogprobEntry> top_logprobs;
  FinishReason finish_reason = FinishReason::none;
  std::string error;
  std::int32_t num_cached_tokens = 0;
  std::chrono::steady_clock::time_point first_scheduled;  // the sequence's first step
};

// The worker owns the backend, the model and the KV cache.
using worker_actor = caf::typed_actor<
    // Runs one step: forward pass and sampling; replies with the sampled tokens.
    caf::replies_to<step_atom, StepWorkPtr>::with<StepOutputPtr>>;

// One per request: turns tokens into text events for its caller.
using request_actor = caf::typed_actor<
    // A token sampled for this request, or its end.
    caf::reacts_to<token_atom, TokenUpdate>,
    // The request's deadline passed.
    caf::reacts_to<timeout_atom>>;

struct Submission {
  RequestId id = 0;
  std::vector<TokenId> prompt;
  SamplingParams params;
  std::int32_t priority = 0;
  request_actor requester;
  std::chrono::steady_clock::time_point submitted;
};

// Runs the iteration loop: plans each step, sends it to the worker, fans out tokens.
using scheduler_actor = caf::typed_actor<
    // Queues a request.
    caf::reacts_to<submit_atom, Submission>,
    // Ends a request now (cancelled, stop string, deadline); frees its blocks.
    caf::reacts_to<abort_atom, RequestId, FinishReason>,
    // The engine's numbers.
    caf::replies_to<stats_atom>::with<EngineStats>>;

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::StepWorkPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::StepOutputPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::TokenUpdate)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::Submission)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::FinishReason)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::EngineStats)
