#include "actors/parallel/router_actor.hpp"

#include <algorithm>
#include <memory>

#include "actors/parallel/elastic.hpp"

namespace troupe::actors::parallel {

namespace {

using Self = RouterSelf;

// Probes answer at once (the replicas' schedulers never block); this only bounds a
// replica that is wedged.
constexpr auto kProbeTimeout = std::chrono::seconds(10);

constexpr std::size_t kMaxRecentAborts = 4096;

// How often a moved request that found no replica up asks again.
constexpr auto kFailoverRetry = std::chrono::milliseconds(250);

void end_request(Self self, const Submission& s, FinishReason reason, std::string why) {
  self->send(s.requester, token_atom::value, end_of(s.id, reason, std::move(why)));
}

// Every probe is in: the router picks, the submission goes there.
void route(Self self, RequestId id) {
  auto& state = self->state;
  auto it = state.pending.find(id);
  RouterState::Pending pending = std::move(it->second);
  state.pending.erase(it);
  // What the router sent a replica that its answer did not count yet waits there too.
  for (std::size_t i = 0; i < pending.views.size(); ++i) {
    const std::int64_t unseen = state.replicas[i].num_routed - pending.received[i];
    pending.views[i].num_waiting += static_cast<std::int32_t>(std::max<std::int64_t>(unseen, 0));
  }
  const auto route = state.router.pick(pending.views);
  if (!route) {
    // A request moved off a lost worker waits for a replica (a node may join, a worker
    // load) until --failover-timeout; a new one is refused at once.
    Submission& s = pending.submission;
    const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count();
    if (s.moved && s.failover_deadline_ns == 0) {
      s.failover_deadline_ns = now + std::chrono::nanoseconds(state.failover_timeout).count();
    }
    if (s.moved && now < s.failover_deadline_ns) {
      state.retrying[s.id] = s.requester;
      self->delayed_send(self, kFailoverRetry, submit_atom::value, std::move(s));
      return;
    }
    end_request(self, s, FinishReason::error, "no replica is up");
    return;
  }
  auto& replica = state.replicas[route->replica];
  if (!replica.actor) {
    // It left (elastic) since it answered: routed again among those there now.
    self->send(self, submit_atom::value, std::move(pending.submission));
    return;
  }
  ++replica.num_routed;
  if (route->reason == engine::RouteReason::prefix_hit) ++replica.num_prefix_routed;
  self->send(replica.actor, submit_atom::value, std::move(pending.submission));
}

void on_probe(Self self, RequestId id, std::size_t replica, std::optional<ReplicaProbe> probe) {
  auto it = self->state.pending.find(id);
  if (it == self->state.pending.end()) return;  // aborted meanwhile
  engine::ReplicaView& view = it->second.views[replica];
  view.up = probe.has_value() && probe->up;
  if (probe) {
    view.num_waiting = probe->num_waiting;
    view.num_running = probe->num_running;
    view.kv_usage = probe->kv_usage;
    view.cached_prefix_tokens = probe->cached_prefix_tokens;
    it->second.received[replica] = probe->num_received;
  }
  if (--it->second.num_unanswered == 0) route(self, id);
}

// Asks every replica for `Answer` to `atom`, then hands `done` the answers in order
// (a replica that could not answer leaves its slot empty).
template <class Answer, class Atom, class Done>
void gather(Self self, Atom atom, Done done) {
  struct Gathered {
    std::vector<std::optional<Answer>> answers;
    std::size_t left = 0;
    Done done;
  };
  const auto& replicas = self->state.replicas;
  const std::size_t n = replicas.size();
  const auto present = static_cast<std::size_t>(num_present(self->state));
  auto g =
      std::make_shared<Gathered>(Gathered{std::vector<std::optional<Answer>>(n), present, done});
  if (present == 0) return g->done(g->answers);
  for (std::size_t i = 0; i < n; ++i) {
    if (!replicas[i].actor) continue;
    self->request(replicas[i].actor, kProbeTimeout, atom)
        .then(
            [g, i](const Answer& a) {
              g->answers[i] = a;
              if (--g->left == 0) g->done(g->answers);
            },
            [g](const caf::error&) {
              if (--g->left == 0) g->done(g->answers);
            });
  }
}

using Answers = std::vector<std::optional<std::vector<ReplicaStats>>>;

// A LoRA adapter in a slot of every replica: the first replica's failure, by its index,
// or "" once all hold it. The engine empties the slot again after a failure.
caf::result<std::string> lora_replicas(Self self, std::int32_t slot, const std::string& path) {
  struct Gathered {
    caf::typed_response_promise<std::string> promise;
    std::size_t pending = 0;
    std::string error;
  };
  auto g = std::make_shared<Gathered>();
  g->promise = self->make_response_promise<std::string>();
  g->pending = static_cast<std::size_t>(num_present(self->state));
  auto done = [g](std::size_t i, const std::string& error) {
    if (!error.empty() && g->error.empty())
      g->error = "replica " + std::to_string(i) + ": " + error;
    if (--g->pending == 0) g->promise.deliver(g->error);
  };
  remember_lora(self, slot, path);
  if (g->pending == 0) g->promise.deliver(std::string());
  for (std::size_t i = 0; i < self->state.replicas.size(); ++i) {
    if (!self->state.replicas[i].actor) continue;
    self->request(self->state.replicas[i].actor, kLoadTimeout, lora_atom::value, slot, path)
        .then([done, i](const std::string& error) { done(i, error); },
              [self, done, i](const caf::error& e) {
                done(i, "it did not answer: " + self->system().render(e));
              });
  }
  return g->promise;
}

// Each replica's own numbers, with what the router sent it (the replicas there now).
std::vector<ReplicaStats> replica_stats(Self self, const Answers& answers) {
  std::vector<ReplicaStats> out;
  for (std::size_t i = 0; i < answers.size() && i < self->state.replicas.size(); ++i) {
    const auto& r = self->state.replicas[i];
    if (!r.actor) continue;
    ReplicaStats s;
    if (answers[i] && answers[i]->size() == 1) {
      s = answers[i]->front();
    } else {
      s.up = false;  // it did not answer
      s.state = "unknown";
    }
    s.index = static_cast<std::int32_t>(i);
    s.num_routed = r.num_routed;
    s.num_prefix_routed = r.num_prefix_routed;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

EngineStats sum_stats(const std::vector<ReplicaStats>& replicas) {
  EngineStats sum;
  double held_blocks = 0.0;
  for (const ReplicaStats& r : replicas) {
    const EngineStats& s = r.stats;
    sum.num_running += s.num_running;
    sum.num_waiting += s.num_waiting;
    held_blocks += s.kv_usage * s.num_kv_blocks;
    sum.peak_kv_usage = std::max(sum.peak_kv_usage, s.peak_kv_usage);
    sum.num_preemptions += s.num_preemptions;
    sum.prefix_queried_tokens += s.prefix_queried_tokens;
    sum.prefix_hit_tokens += s.prefix_hit_tokens;
    sum.num_steps += s.num_steps;
    sum.num_step_tokens += s.num_step_tokens;
    sum.num_step_sequences += s.num_step_sequences;
    sum.num_prompt_tokens += s.num_prompt_tokens;
    sum.num_generated_tokens += s.num_generated_tokens;
    sum.step_seconds += s.step_seconds;
    sum.num_decode_steps += s.num_decode_steps;
    sum.decode_step_seconds += s.decode_step_seconds;
    sum.schedule_seconds += s.schedule_seconds;
    sum.num_worker_restarts += s.num_worker_restarts;
    sum.num_kv_blocks += s.num_kv_blocks;
    sum.prefix_cache_blocks += s.prefix_cache_blocks;
    sum.block_size = std::max(sum.block_size, s.block_size);
    sum.spec_num_drafts += s.spec_num_drafts;
    sum.spec_num_draft_tokens += s.spec_num_draft_tokens;
    sum.spec_num_accepted_tokens += s.spec_num_accepted_tokens;
    auto& per_pos = sum.spec_num_accepted_tokens_per_pos;
    if (per_pos.size() < s.spec_num_accepted_tokens_per_pos.size()) {
      per_pos.resize(s.spec_num_accepted_tokens_per_pos.size(), 0);
    }
    for (std::size_t p = 0; p < s.spec_num_accepted_tokens_per_pos.size(); ++p) {
      per_pos[p] += s.spec_num_accepted_tokens_per_pos[p];
    }
  }
  sum.kv_usage = sum.num_kv_blocks > 0 ? held_blocks / sum.num_kv_blocks : 0.0;
  return sum;
}

namespace {

router_actor::behavior_type behavior(Self self, std::vector<replica_actor> replicas,
                                     engine::RouterConfig config, caf::timespan failover_timeout,
                                     ElasticSetup elastic) {
  auto& state = self->state;
  state.failover_timeout = failover_timeout;
  state.elastic = std::move(elastic);
  for (auto& r : replicas) {
    // Each replica hands back to the router the requests of a worker it lost.
    self->send(r, router_atom::value, caf::actor_cast<front_actor>(self));
    state.replicas.push_back({std::move(r)});
  }
  state.router = engine::Router(config);
  if (state.elastic.factory || state.elastic.count) {  // elastic: the count is told
    publish_replicas(self);
    grow(self);
  }
  // Shutting down: the replicas end their requests; those still being routed end here.
  self->set_exit_handler([self](const caf::exit_msg& msg) {
    for (auto& [id, p] : self->state.pending) {
      end_request(self, p.submission, FinishReason::abort, "the engine is shutting down");
    }
    self->state.pending.clear();
    // Those waiting for a replica to take them: their retries will not come.
    for (auto& [id, requester] : self->state.retrying) {
      self->send(requester, token_atom::value,
                 end_of(id, FinishReason::abort, "the engine is shutting down"));
    }
    self->state.retrying.clear();
    for (auto& r : self->state.replicas) {
      if (r.actor) self->send_exit(r.actor, msg.reason);
    }
    self->quit(msg.reason);
  });
  return {
      [self](submit_atom, Submission& s) {
        auto& state = self->state;
        const RequestId id = s.id;
        state.retrying.erase(id);  // its retry (if it was one) is here
        if (state.recent_aborts.erase(id) > 0) {
          end_request(self, s, FinishReason::abort, "");
          return;
        }
        const std::size_t n = state.replicas.size();
        auto& pending = state.pending[id];
        pending.views.resize(n);
        pending.received.assign(n, 0);
        pending.num_unanswered = static_cast<std::size_t>(num_present(state));
        pending.submission = std::move(s);
        if (pending.num_unanswered == 0) return route(self, id);  // none there (elastic)
        // Answers come later, as messages: the entry (and its prompt) stays until then.
        const std::vector<TokenId>& prompt = pending.submission.prompt;
        const std::int32_t adapter = pending.submission.adapter;  // its prefixes are its own
        for (std::size_t i = 0; i < n; ++i) {
          if (!state.replicas[i].actor) {
            pending.views[i].up = false;  // an empty index
            continue;
          }
          self->request(state.replicas[i].actor, kProbeTimeout, probe_atom::value, prompt, adapter)
              .then([self, id, i](const ReplicaProbe& p) { on_probe(self, id, i, p); },
                    [self, id, i](const caf::error&) { on_probe(self, id, i, std::nullopt); });
        }
      },
      [self](abort_atom, RequestId id, FinishReason reason) {
        auto& state = self->state;
        if (auto it = state.pending.find(id); it != state.pending.end()) {
          end_request(self, it->second.submission, reason, "");
          state.pending.erase(it);
          return;
        }
        for (auto& r : state.replicas) {
          if (r.actor) self->send(r.actor, abort_atom::value, id, reason);
        }
        if (state.recent_aborts.insert(id).second) state.recent_abort_order.push_back(id);
        if (state.recent_abort_order.size() > kMaxRecentAborts) {
          state.recent_aborts.erase(state.recent_abort_order.front());
          state.recent_abort_order.pop_front();
        }
      },
      [self](stats_atom) {
        auto rp = self->make_response_promise<EngineStats>();
        gather<std::vector<ReplicaStats>>(self, replicas_atom::value,
                                          [self, rp](const Answers& a) mutable {
                                            rp.deliver(sum_stats(replica_stats(self, a)));
                                          });
        return rp;
      },
      [self](lora_atom, std::int32_t slot, const std::string& path) {
        return lora_replicas(self, slot, path);
      },
      [self](replicas_atom) {
        auto rp = self->make_response_promise<std::vector<ReplicaStats>>();
        gather<std::vector<ReplicaStats>>(
            self, replicas_atom::value,
            [self, rp](const Answers& a) mutable { rp.deliver(replica_stats(self, a)); });
        return rp;
      },
      [self](leave_atom, std::int32_t index) { return on_leave(self, index); },
      [self](grown_atom, std::int32_t index, SupplyNews& news) { on_grown(self, index, news); },
      [self](grow_atom) { grow(self); },
  };
}

}  // namespace

router_actor::behavior_type router(Self self, std::vector<replica_actor> replicas,
                                   engine::RouterConfig config, caf::timespan failover_timeout) {
  return behavior(self, std::move(replicas), config, failover_timeout, {});
}

router_actor::behavior_type elastic_router(Self self, std::vector<replica_actor> replicas,
                                           engine::RouterConfig config,
                                           caf::timespan failover_timeout, ElasticSetup elastic) {
  return behavior(self, std::move(replicas), config, failover_timeout, std::move(elastic));
}

}  // namespace troupe::actors::parallel
