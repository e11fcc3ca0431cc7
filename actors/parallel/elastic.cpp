#include "actors/parallel/elastic.hpp"
#include "monitoring/log.hpp"

#include "actors/replica/replica_start.hpp"

namespace troupe::actors::parallel {

namespace {

// After a failed supply (the head shutting down, say), the next is asked for this late.
constexpr auto kGrowRetry = std::chrono::seconds(1);

std::string max_text(std::int32_t max) {
  return max == EngineConfig::kUnboundedReplicas ? "as many as nodes" : std::to_string(max);
}

}  // namespace

std::int32_t num_present(const RouterState& state) {
  std::int32_t n = 0;
  for (const auto& r : state.replicas) n += r.actor ? 1 : 0;
  return n;
}

void publish_replicas(RouterSelf self) {
  auto& state = self->state;
  const ElasticSetup& e = state.elastic;
  const std::int32_t now = num_present(state);
  if (e.count) *e.count = now;
  if (e.metrics) {
    e.metrics->set_replica_count(now, e.min,
                                 e.max == EngineConfig::kUnboundedReplicas ? -1 : e.max);
  }
  if (e.registry) {
    std::vector<caf::actor> handles;
    for (const auto& r : state.replicas) handles.push_back(caf::actor_cast<caf::actor>(r.actor));
    self->send(e.registry, replicas_atom::value, std::move(handles));
  }
}

void grow(RouterSelf self) {
  auto& state = self->state;
  const ElasticSetup& e = state.elastic;
  if (!e.factory) return;
  // One waits for a node at a time (the registry places them in the order they asked).
  for (const auto& [index, placed] : state.growing) {
    if (!placed) return;
  }
  const auto wanted = std::int64_t{num_present(state)} + std::ssize(state.growing);
  if (wanted >= e.max) return;
  // The lowest free index: a replica that left gives its index (and its series) back.
  std::int32_t index = 0;
  while ((static_cast<std::size_t>(index) < state.replicas.size() &&
          state.replicas[static_cast<std::size_t>(index)].actor) ||
         state.growing.contains(index)) {
    ++index;
  }
  state.growing[index] = false;
  router_actor me = caf::actor_cast<router_actor>(self);
  e.factory->supply(self->home_system(), index, self->address(), [me, index](SupplyNews news) {
    if (news.stage == SupplyNews::Stage::placed) {
      monitoring::logf(monitoring::LogLevel::info, "replica %d loads on node %s", index,
                       cluster::node_label(news.nodes).c_str());
    }
    caf::anon_send(me, grown_atom::value, index, std::move(news));
  });
}

void on_grown(RouterSelf self, std::int32_t index, SupplyNews& news) {
  auto& state = self->state;
  const auto growing = state.growing.find(index);
  if (growing == state.growing.end()) {
    if (news.worker) self->send_exit(news.worker, caf::exit_reason::kill);
    return;
  }
  if (news.stage == SupplyNews::Stage::placed) {
    // Its worker loads there: the next node to join is the next replica's, now.
    growing->second = true;
    return grow(self);
  }
  state.growing.erase(growing);
  if (news.stage != SupplyNews::Stage::loaded) {
    monitoring::logf(monitoring::LogLevel::warning, "no worker for a new replica %d: %s", index,
                     news.error.message.c_str());
    self->delayed_send(self, kGrowRetry, grow_atom::value);
    return;
  }
  const std::string node = cluster::node_label(news.nodes);
  StartedReplica started = state.elastic.factory->make(self->home_system(), index, std::move(news));
  replica_actor replica = std::move(started.scheduler);
  self->send(replica, router_atom::value, caf::actor_cast<front_actor>(self));
  // The LoRA adapters loaded while serving (before any request is routed to it: a
  // replica hears the router's messages in order).
  for (std::size_t slot = 0; slot < state.lora_paths.size(); ++slot) {
    if (!state.lora_paths[slot]) continue;
    self->request(replica, kLoadTimeout, lora_atom::value, static_cast<std::int32_t>(slot + 1),
                  *state.lora_paths[slot])
        .then(
            [index, slot](const std::string& error) {
              if (!error.empty()) {
                monitoring::logf(monitoring::LogLevel::warning,
                                 "replica %d cannot load the LoRA adapter of slot %zu: %s", index,
                                 slot + 1, error.c_str());
              }
            },
            [](const caf::error&) {});
  }
  const auto at = static_cast<std::size_t>(index);
  if (state.replicas.size() <= at) state.replicas.resize(at + 1);
  state.replicas[at] = {std::move(replica)};
  publish_replicas(self);
  const ElasticSetup& e = state.elastic;
  monitoring::logf(monitoring::LogLevel::info,
                   "replica %d joined on node %s: %d replica(s) (min %d, max %s)", index,
                   node.c_str(), num_present(state), e.min, max_text(e.max).c_str());
  grow(self);
}

bool on_leave(RouterSelf self, std::int32_t index) {
  auto& state = self->state;
  const auto at = static_cast<std::size_t>(index);
  if (at >= state.replicas.size() || !state.replicas[at].actor) return true;
  // Its address is checked: only the replica itself may say it leaves.
  if (self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(state.replicas[at].actor)) {
    return false;
  }
  state.replicas[at] = {};
  publish_replicas(self);
  const ElasticSetup& e = state.elastic;
  const std::int32_t now = num_present(state);
  monitoring::logf(now < e.min ? monitoring::LogLevel::warning : monitoring::LogLevel::info,
                   "replica %d left: %d replica(s) (min %d, max %s)%s", index, now, e.min,
                   max_text(e.max).c_str(),
                   now < e.min ? "; below the minimum, the next node to join takes one" : "");
  grow(self);
  return true;
}

void remember_lora(RouterSelf self, std::int32_t slot, const std::string& path) {
  auto& paths = self->state.lora_paths;
  if (slot < 1) return;
  if (paths.size() < static_cast<std::size_t>(slot)) paths.resize(static_cast<std::size_t>(slot));
  paths[static_cast<std::size_t>(slot - 1)] = path;
}

}  // namespace troupe::actors::parallel
