// One generation's way out of the engine, the same for SSE (completion_session.cpp) and
// the WebSocket (websocket_session.cpp): its admission, the submit of its sequences (n
// choices, best_of candidates, a batch's prompts), their cancellation, the output bound,
// and each engine event turned into one choice's output as the renderers take it (a
// scoring token dropped, a read chat's text held back until it is no marker or tool
// call, the access log's entry kept). The engine's thread only queues events; everything
// else runs on the connection's strand, where the transport frames and writes them.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "net/choice_text.hpp"
#include "net/server_impl.hpp"

namespace troupe::net {

// One engine event of one choice, ready to render.
struct ChoiceEvent {
  int index = 0;  // the choice: prompt-major (prompt * sequences_per_prompt() + i)
  // The engine's event: a prompt-scoring request's generated token dropped (score_only);
  // a read chat's text replaced by the answer that may go out now.
  TokenEvent event;
  // A read chat (streamed, with thinking apart or tools): what its ChoiceTextStream let
  // out of this event (reasoning, tool call deltas, and on its last event the calls).
  std::optional<ChoiceText> read;
  bool called = false;     // the choice's answer was read as tool calls (on its last event)
  std::int64_t bytes = 0;  // what it holds of the output bound until given back (taken())
};

class GenerationStream : public std::enable_shared_from_this<GenerationStream> {
 public:
  // What the server lends every generation.
  struct Shared {
    Engine& engine;
    std::shared_ptr<CallbackGate> gate;
    std::shared_ptr<Admission> admission;
    // Refuses every generation once the server drains, and knows the ones that run.
    std::shared_ptr<Drain> drain;
  };
  // How one transport runs it.
  struct Options {
    // Events as they come (a read chat's text held back while it may be a marker or a
    // call), or the whole answer at its end (nothing read here).
    bool streamed = true;
    // The connection's output bound: an event's memory counts from the engine's callback
    // until the transport gives it back (taken()).
    std::shared_ptr<OutputBound> output;
    // The 429's message when the server is at its limit of requests in flight.
    std::string busy_message;
    // Runs on the strand once the bound is crossed, after the requests were cancelled:
    // the transport says why and closes. Dropped by detach().
    std::function<void()> on_overflow;
  };

  // Takes an admission slot and submits the request's sequences (a prompt's i-th with the
  // seed plus i, as it would alone), their events bound for `strand`. A 503 with
  // Retry-After once the server drains, a 429 when it is full, or the engine's refusal
  // as the client sees it (api_error); nothing keeps running then. The one admission
  // check of HTTP and the socket alike.
  static tl::expected<std::shared_ptr<GenerationStream>, ApiError> start(
      const Shared& shared, const CompletionRequest& request, Options options,
      asio::any_io_executor strand);

  // The next event of any choice (on the strand), its choice's end counted in `entry`
  // (first token, output tokens, finish reason); none once every choice has ended, or
  // when the stream was closed.
  asio::awaitable<std::optional<ChoiceEvent>> next(AccessEntry& entry);
  // The event has been written (or dropped): its bytes leave the output bound.
  void taken(const ChoiceEvent& event) { options_.output->remove(event.bytes); }
  // Cancels every sequence still running (on the strand): each still ends with an event
  // (finish_reason "abort"), which next() gives.
  void cancel();
  // Stops reading: a pending next() returns none. What the engine still sends is dropped.
  void close();
  // The server's drain ran out of time (posted to the strand): every sequence still
  // running is cancelled, and its end comes out of next() as an error (503, "the server
  // shut down"), finish reason "error", so each transport ends it as it ends a failure.
  void cut();
  // cut() posted to the strand, from any thread.
  void cut_on_strand() {
    asio::post(strand_, [self = shared_from_this()] { self->cut(); });
  }
  // The transport is done with the stream: an overflow after this touches nothing of it.
  void detach() { options_.on_overflow = nullptr; }
  // Its last output is written (or never will be): the drain stops waiting for it. Once;
  // from any thread.
  void finished();
  // What calls finished() when its last copy goes: the socket's last frame carries it,
  // so that the drain waits until the writer has written (or dropped) that frame.
  std::shared_ptr<void> finished_when_dropped() {
    return std::shared_ptr<void>(nullptr, [self = shared_from_this()](void*) { self->finished(); });
  }

  int num_choices() const { return static_cast<int>(ids_.size()); }
  int num_open() const { return num_open_; }
  bool over() const { return options_.output->over(); }
  const std::vector<RequestId>& ids() const { return ids_; }

  GenerationStream(const Shared& shared, const CompletionRequest& request, Options options,
                   asio::any_io_executor strand);

 private:
  // On the engine's thread: frees the admission slot when the last sequence ends, counts
  // the event against the bound and queues it (never blocks).
  void on_event(const TokenEvent& event);
  void overflowed();  // on the strand

  Shared shared_;
  Options options_;
  asio::any_io_executor strand_;
  std::shared_ptr<EventChannel> channel_;
  bool score_only_ = false;
  std::atomic<bool> registered_{false};  // in the drain's live set until finished()
  bool cut_ = false;                     // on the strand: cut() ran
  std::atomic<int> num_running_{0};      // sequences not yet ended in the engine
  // Touched on the strand only.
  std::vector<RequestId> ids_;
  std::vector<ChoiceTextStream> reads_;  // one per choice when a streamed chat is read
  int num_open_ = 0;                     // choices whose end next() has not given yet
};

}  // namespace troupe::net
