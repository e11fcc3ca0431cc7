#include "actors/replica/worker_supply.hpp"
#include "monitoring/log.hpp"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>

#include "actors/parallel/group_actor.hpp"

namespace troupe::actors {

namespace {

using Self = caf::event_based_actor*;
using Stage = SupplyNews::Stage;

struct Supply {
  WorkerSource source;
  engine::WorkerSpec spec;
  bool retry = false;
  std::uint64_t number = 0;
  caf::actor_addr owner;
  std::function<void(SupplyNews)> news;
  worker_actor worker;  // the one being loaded (null: none yet)
  std::vector<std::string> nodes;
};
using SupplyPtr = std::shared_ptr<Supply>;

bool on_nodes(const Supply& s) {
  return s.source.registry != nullptr;
}

// Stops the worker being loaded: it is not this supply's any more.
void drop_worker(Self self, Supply& s) {
  if (!s.worker) return;
  self->demonitor(s.worker.address());
  self->send_exit(s.worker, caf::exit_reason::kill);
  s.worker = nullptr;
}

void fail(Self self, Supply& s, Error error) {
  drop_worker(self, s);
  SupplyNews n;
  n.number = s.number;
  n.stage = Stage::failed;
  n.nodes = s.nodes;
  n.error = std::move(error);
  s.news(std::move(n));
  self->quit();
}

void place(Self self, const SupplyPtr& s);

// The worker did not load on its node(s): with retry, that node is not asked again and
// another is waited for; without, this is the answer.
void not_loaded(Self self, const SupplyPtr& s, Error error, const std::string& unfit_node) {
  const std::string node = cluster::node_label(s->nodes);
  if (!on_nodes(*s) || !s->retry) {
    if (on_nodes(*s)) {
      error.message = "node " + node + ": " + error.message;
      // Said at once: the engine's end may take a while.
      monitoring::logf(monitoring::LogLevel::warning, "replica %d cannot load on %s",
                       s->source.replica, error.message.c_str());
    }
    return fail(self, *s, std::move(error));
  }
  monitoring::logf(monitoring::LogLevel::warning, "replica %d cannot load on node %s: %s",
                   s->source.replica, node.c_str(), error.message.c_str());
  if (!unfit_node.empty()) {
    self->send(s->source.registry, cluster::unfit_atom::value, unfit_node, error.message);
  }
  drop_worker(self, *s);
  s->nodes.clear();
  place(self, s);
}

// The node no worker should be placed on again after a failed load: the failing rank's.
std::string failed_node(const Supply& s, const engine::LoadReport& report) {
  if (s.nodes.empty()) return {};
  const auto rank = static_cast<std::size_t>(std::max(report.failed_rank, 0));
  return s.nodes[std::min(rank, s.nodes.size() - 1)];
}

void load(Self self, const SupplyPtr& s) {
  self->monitor(s->worker);
  // Answers about a worker given up meanwhile are stale.
  const caf::actor_addr loading = s->worker.address();
  self->request(s->worker, s->source.load_timeout, load_atom::value, s->spec)
      .then(
          [self, s, loading](engine::LoadReport& report) {
            if (!s->worker || s->worker.address() != loading) return;
            if (report.failed) {
              return not_loaded(self, s, {report.error.code, report.error.message},
                                failed_node(*s, report));
            }
            self->demonitor(s->worker.address());
            SupplyNews n;
            n.number = s->number;
            n.stage = Stage::loaded;
            n.worker = std::move(s->worker);
            n.nodes = s->nodes;
            n.report = std::move(report);
            s->worker = nullptr;
            s->news(std::move(n));
            self->quit();
          },
          [self, s, loading](const caf::error& err) {
            if (!s->worker || s->worker.address() != loading) return;
            // A group's failing node is not known here: none is marked.
            not_loaded(self, s,
                       {ErrorCode::internal, "the worker stopped: " + self->system().render(err)},
                       s->nodes.size() == 1 ? s->nodes.front() : std::string());
          });
}

// No node within the wait: why, with the nodes that did join.
void explain_no_node(Self self, const SupplyPtr& s) {
  self->request(s->source.registry, std::chrono::seconds(5), cluster::nodes_atom::value)
      .then(
          [self, s](const std::vector<cluster::NodeView>& nodes) {
            const WorkerSource& src = s->source;
            // A stage of several ranks needs a node with that many slots: say each one's.
            const bool by_slots = src.stage_ranks > 1;
            std::string joined;
            for (const auto& n : nodes) {
              joined += (joined.empty() ? "" : ", ") + n.info.name;
              if (by_slots) joined += " (" + std::to_string(n.slots) + " slot(s))";
            }
            const std::string each = by_slots ? ", each with " + std::to_string(src.stage_ranks) +
                                                    " slots (its cores / --threads, or its GPUs)"
                                              : std::string();
            fail(self, *s,
                 {ErrorCode::unavailable,
                  "no node to place replica " + std::to_string(src.replica) + " on within " +
                      std::to_string(src.placement_wait.count()) +
                      " s: " + std::to_string(src.num_replicas) + " replica(s) of " +
                      std::to_string(src.tensor_parallel_size) +
                      (src.stage_ranks > 0 ? " worker(s), a stage a node," : " rank(s)") +
                      " need " + std::to_string(src.nodes_needed) + " node(s) at least" + each +
                      ", and " + std::to_string(nodes.size()) + " joined" +
                      (joined.empty() ? "" : " (" + joined + ")")});
          },
          [self, s](const caf::error& err) {
            fail(self, *s,
                 {ErrorCode::unavailable, "replica " + std::to_string(s->source.replica) +
                                              " cannot be placed: " + self->system().render(err)});
          });
}

void place(Self self, const SupplyPtr& s) {
  if (!on_nodes(*s)) {
    const WorkerSource& src = s->source;
    s->worker = src.spawn_local
                    ? src.spawn_local(self->home_system())
                    : parallel::spawn_local_worker(self->home_system(), src.tensor_parallel_size,
                                                   src.before_step, src.collective_timeout);
    return load(self, s);
  }
  const caf::duration wait = s->source.placement_wait.count() > 0
                                 ? caf::duration{s->source.placement_wait}
                                 : caf::duration{caf::infinite};
  self->request(s->source.registry, wait, cluster::place_atom::value, s->source.replica,
                s->source.tensor_parallel_size, s->source.stage_ranks)
      .then(
          [self, s](cluster::Placement& placed) {
            s->nodes = placed.nodes;
            s->worker = parallel::worker_for(self->home_system(), std::move(placed),
                                             s->source.collective_timeout);
            SupplyNews n;
            n.number = s->number;
            n.stage = Stage::placed;
            n.nodes = s->nodes;
            s->news(std::move(n));
            load(self, s);
          },
          [self, s](const caf::error&) { explain_no_node(self, s); });
}

}  // namespace

void supply_worker(caf::actor_system& system, WorkerSource source, engine::WorkerSpec spec,
                   bool retry, std::uint64_t number, caf::actor_addr owner,
                   std::function<void(SupplyNews)> news) {
  auto s = std::make_shared<Supply>();
  s->source = std::move(source);
  s->spec = std::move(spec);
  s->retry = retry;
  s->number = number;
  s->owner = std::move(owner);
  s->news = std::move(news);
  // Hidden, as the engine's own queries are: troupe_live_actors counts requests and the
  // replicas' actors, and a supply waiting for a node is its replica's business (it ends
  // with the replica).
  system.spawn<caf::hidden>([s](caf::event_based_actor* self) {
    if (s->owner) self->monitor(s->owner);
    self->set_down_handler([self, s](const caf::down_msg& down) {
      if (down.source == s->owner) {
        // No one is left to take the worker.
        drop_worker(self, *s);
        self->quit();
        return;
      }
      if (!s->worker || down.source != s->worker.address()) return;
      const std::string why = self->system().render(down.reason);
      if (on_nodes(*s) && s->retry) {
        // Another node, at once (the load's answer would come only at its timeout).
        monitoring::logf(monitoring::LogLevel::warning,
                         "replica %d: the node %s went while its worker loaded: %s",
                         s->source.replica, cluster::node_label(s->nodes).c_str(), why.c_str());
        drop_worker(self, *s);
        s->nodes.clear();
        return place(self, s);
      }
      fail(self, *s, {ErrorCode::unavailable, "the worker went away while it loaded: " + why});
    });
    place(self, s);
  });
}

Result<SupplyNews> supply_and_wait(caf::actor_system& system, WorkerSource source,
                                   engine::WorkerSpec spec) {
  std::vector<WorkerSource> one;
  one.push_back(std::move(source));
  TROUPE_TRY(auto loaded, supply_all_and_wait(system, std::move(one), spec));
  return std::move(loaded.front());
}

Result<std::vector<SupplyNews>> supply_all_and_wait(caf::actor_system& system,
                                                    std::vector<WorkerSource> sources,
                                                    const engine::WorkerSpec& spec) {
  struct Waiting {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<std::optional<SupplyNews>> loaded;
    std::size_t num_loaded = 0;
    std::optional<Error> failed;  // the first failure: what is loaded, or loads later, goes
  };
  auto waiting = std::make_shared<Waiting>();
  waiting->loaded.resize(sources.size());
  // The supplies' owner: its end stops every supply still at work, and its worker.
  auto owner = system.spawn<caf::hidden>(
      [](caf::event_based_actor*) -> caf::behavior { return {[](std::int32_t) {}}; });
  for (std::size_t i = 0; i < sources.size(); ++i) {
    supply_worker(system, std::move(sources[i]), spec, /*retry=*/false, 0, owner.address(),
                  [waiting, i](SupplyNews n) {
                    if (n.stage == Stage::placed) return;
                    std::lock_guard lock(waiting->mutex);
                    if (n.stage == Stage::failed) {
                      if (!waiting->failed) waiting->failed = std::move(n.error);
                    } else if (waiting->failed) {
                      caf::anon_send_exit(n.worker, caf::exit_reason::kill);
                    } else {
                      waiting->loaded[i] = std::move(n);
                      ++waiting->num_loaded;
                    }
                    waiting->changed.notify_all();
                  });
  }
  std::unique_lock lock(waiting->mutex);
  waiting->changed.wait(
      lock, [&] { return waiting->failed || waiting->num_loaded == waiting->loaded.size(); });
  caf::anon_send_exit(owner, caf::exit_reason::kill);
  if (waiting->failed) {
    for (auto& n : waiting->loaded) {
      if (n) caf::anon_send_exit(n->worker, caf::exit_reason::kill);
    }
    return tl::unexpected(*waiting->failed);
  }
  std::vector<SupplyNews> out;
  for (auto& n : waiting->loaded) out.push_back(std::move(*n));
  return out;
}

}  // namespace troupe::actors
