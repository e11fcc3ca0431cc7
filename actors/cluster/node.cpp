#include "actors/cluster/node.hpp"
#include "monitoring/log.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <caf/io/all.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "actors/cluster/cluster_messages.hpp"
#include "actors/worker_actor.hpp"
#include "worker/backend_factory.hpp"

namespace troupe::actors::cluster {

namespace {

// The workers the head spawned here, to end when the head is gone (CAF keeps them
// alive otherwise: STACK.md, "orphaned workers").
class SpawnedWorkers {
 public:
  // False once the node is closing: the new worker must end at once (the head may place
  // a replica here again before it hears that the node is leaving).
  bool add(caf::actor worker) {
    std::lock_guard lock(mutex_);
    if (closing_) return false;
    workers_.push_back(std::move(worker));
    return true;
  }
  void end_all(bool closing) {
    std::lock_guard lock(mutex_);
    closing_ = closing_ || closing;
    for (auto& w : workers_) caf::anon_send_exit(w, caf::exit_reason::kill);
    workers_.clear();
  }

  // The workers alive here (each one's thread, model and KV cache), said in the log as
  // they start and end: what the node holds, whatever the head believes it placed.
  void started() {
    monitoring::logf(monitoring::LogLevel::info, "a worker started here (%d held)", ++num_held_);
  }
  void ended() {
    monitoring::logf(monitoring::LogLevel::info, "a worker ended here (%d held)", --num_held_);
  }

 private:
  std::mutex mutex_;
  std::vector<caf::actor> workers_;
  bool closing_ = false;
  std::atomic<int> num_held_{0};
};

struct NodeWorkerState {
  worker_actor inner;  // the worker itself, on a thread of its own
  static inline const char* name = "troupe.node_worker";
};

// The node's settings applied to the head's spec: they win.
void apply_settings(const NodeSettings& settings, engine::WorkerSpec& spec) {
  spec.num_threads = settings.num_threads;
  spec.device = settings.device == "cuda" ? Device::cuda : Device::cpu;
  if (spec.device == Device::cuda) {
    // A group's ranks here are consecutive and no more than its GPUs: one GPU each.
    auto gpus = static_cast<std::int32_t>(worker::list_gpus().size());
    if (settings.num_gpus >= 0) gpus = std::min(gpus, settings.num_gpus);
    spec.device_index = gpus > 0 ? spec.rank % gpus : 0;
  }
  if (settings.kv_cache_gb > 0 && spec.num_kv_blocks == 0) {
    spec.kv_cache_bytes = static_cast<std::int64_t>(settings.kv_cache_gb * (1 << 30));
  }
  if (!settings.model_path.empty()) spec.model_path = settings.model_path;
}

// This machine's address on the route to `host` (no packet is sent: a UDP socket's
// connect only picks the route), or 127.0.0.1.
std::string address_toward(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
    return "127.0.0.1";
  }
  std::string address = "127.0.0.1";
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t length = sizeof(local);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) address = text;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return address;
}

// What the head spawns: a remotely spawned actor cannot be detached (CAF 0.17), so it
// hands every message to a detached worker, which answers the head directly. The
// node's own settings (threads, device, KV memory, model path) win over the head's.
worker_actor::behavior_type node_worker(worker_actor::stateful_pointer<NodeWorkerState> self,
                                        const NodeSettings& settings,
                                        const std::shared_ptr<SpawnedWorkers>& spawned) {
  self->state.inner = self->spawn<caf::detached + caf::linked>(
      actors::worker, std::function<void()>{}, settings.collective_host);
  spawned->started();
  self->state.inner->attach_functor([spawned] { spawned->ended(); });
  return {
      [self, settings](load_atom load, engine::WorkerSpec& spec) {
        apply_settings(settings, spec);
        return self->delegate(self->state.inner, load, std::move(spec));
      },
      [self, settings](load_atom load, engine::WorkerSpec& spec, GroupJoin& join) {
        apply_settings(settings, spec);
        return self->delegate(self->state.inner, load, std::move(spec), std::move(join));
      },
      [self](step_atom step, engine::StepWork& work) {
        return self->delegate(self->state.inner, step, std::move(work));
      },
      [self](lora_atom lora, std::int32_t slot, std::string& path) {
        return self->delegate(self->state.inner, lora, slot, std::move(path));
      },
  };
}

NodeInfo describe_node(const NodeSettings& settings) {
  NodeInfo info;
  info.name = settings.name;
  if (info.name.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    info.name = std::string(host) + "-" + std::to_string(::getpid());
  }
  info.token = settings.token;
  info.num_cores = static_cast<std::int32_t>(std::thread::hardware_concurrency());
  info.memory_bytes =
      static_cast<std::int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  info.device = settings.device;
  info.num_threads = settings.num_threads;
  info.collective_host = settings.collective_host;
  info.shutdown_timeout_ms = settings.shutdown_timeout_s * 1000;
  for (const auto& gpu : worker::list_gpus()) {
    if (settings.num_gpus >= 0 &&
        static_cast<std::int32_t>(info.gpu_names.size()) >= settings.num_gpus) {
      break;
    }
    info.gpu_names.push_back(gpu.name);
    info.gpu_memory_bytes.push_back(gpu.memory_bytes);
  }
  return info;
}

// How long past its shutdown timeout a draining node waits for the head to release it
// (the head moves what still runs, which takes a step and a message).
constexpr auto kReleaseGrace = std::chrono::seconds(15);

void sleep_unless_stopped(std::chrono::milliseconds total, const std::atomic<int>& signals) {
  const auto until = std::chrono::steady_clock::now() + total;
  while (signals == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

int run_node(const NodeSettings& given, const std::atomic<int>& signals) {
  NodeSettings settings = given;
  if (settings.collective_host.empty()) {
    settings.collective_host = address_toward(settings.head_host, settings.head_port);
  }
  auto spawned = std::make_shared<SpawnedWorkers>();
  caf::actor_system_config config;
  config.set("scheduler.policy", caf::atom("sharing"));
  // A worker's compute runs on its own thread; messages must reach it meanwhile.
  config.set("middleman.workers", std::size_t{0});
  const TlsFiles tls{settings.tls_certificate, settings.tls_key, settings.tls_ca};
  if (auto bad = check_tls_files(tls); !bad.empty()) {
    std::fprintf(stderr, "troupe node: %s\n", bad.c_str());
    return 1;
  }
  load_middleman(config, tls);
  add_message_types(config);
  config.add_actor_type(kWorkerType,
                        [settings, spawned](worker_actor::stateful_pointer<NodeWorkerState> self) {
                          if (!spawned->add(caf::actor_cast<caf::actor>(self))) {
                            self->quit(caf::exit_reason::user_shutdown);
                          }
                          return node_worker(self, settings, spawned);
                        });
  add_cluster_types(config);
  caf::actor_system system(config);
  const NodeInfo info = describe_node(settings);
  const std::string head = settings.head_host + ":" + std::to_string(settings.head_port);
  auto backoff = std::chrono::milliseconds(250);
  int result = 0;
  while (signals == 0) {
    auto registry = connect_registry(system, settings.head_host, settings.head_port, tls);
    if (!registry) {
      monitoring::logf(monitoring::LogLevel::warning,
                       "cannot reach the head at %s (%s); retrying in %lld ms", head.c_str(),
                       system.render(registry.error()).c_str(),
                       static_cast<long long>(backoff.count()));
      sleep_unless_stopped(backoff, signals);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
      continue;
    }
    // The keeper: its end tells the head this node is gone. It goes before the workers
    // do, so that the head does not place a replica here again.
    bool refused = false, lost = false, released = false;
    {
      caf::scoped_actor self{system};
      JoinReply reply{false, ""};
      std::string failed;
      self->request(*registry, std::chrono::seconds(10), join_atom::value, info,
                    caf::actor_cast<caf::actor>(self))
          .receive([&](JoinReply& r) { reply = std::move(r); },
                   [&](const caf::error& e) { failed = system.render(e); });
      if (!failed.empty()) {
        monitoring::logf(monitoring::LogLevel::warning,
                         "could not join the head at %s (%s); retrying", head.c_str(),
                         failed.c_str());
      } else if (!reply.accepted) {
        monitoring::logf(monitoring::LogLevel::warning, "the head at %s refused %s: %s",
                         head.c_str(), info.name.c_str(), reply.message.c_str());
        refused = true;
      } else {
        backoff = std::chrono::milliseconds(250);
        monitoring::logf(monitoring::LogLevel::info, "%s joined the head at %s", info.name.c_str(),
                         head.c_str());
        self->monitor(*registry);
        bool draining = false;
        auto give_up = std::chrono::steady_clock::time_point::max();
        while (!lost && !released && signals < 2) {
          if (signals == 1 && !draining) {
            draining = true;
            self->send(*registry, drain_atom::value);
            give_up = std::chrono::steady_clock::now() +
                      std::chrono::seconds(settings.shutdown_timeout_s) + kReleaseGrace;
            monitoring::logf(monitoring::LogLevel::info,
                             "draining: the head moves this node's requests off (up to %lld s); "
                             "a second SIGTERM or Ctrl-C leaves now",
                             static_cast<long long>(settings.shutdown_timeout_s));
          }
          if (std::chrono::steady_clock::now() > give_up) {
            monitoring::logf(monitoring::LogLevel::warning,
                             "the head did not release this node in time; leaving");
            break;
          }
          self->receive([&](const caf::down_msg&) { lost = true; },
                        [&](release_atom) { released = true; },
                        caf::after(std::chrono::milliseconds(100)) >> [] {});
        }
        if (released) {
          monitoring::logf(monitoring::LogLevel::info, "drained: the head released this node");
        } else if (signals >= 2) {
          monitoring::logf(monitoring::LogLevel::warning, "second signal: leaving at once");
        }
      }
    }
    // Released by the head (its drain, asked by SIGTERM or over HTTP): the node is done.
    const bool stop = signals > 0 || released;
    spawned->end_all(stop);
    if (released) break;
    if (refused) {
      result = 1;
      break;
    }
    if (lost) {
      monitoring::logf(monitoring::LogLevel::warning, "lost the head at %s; joining again",
                       head.c_str());
    } else if (!stop) {
      sleep_unless_stopped(backoff, signals);
    }
  }
  spawned->end_all(true);
  // CAF 0.17 can wait forever in ~actor_system for a detached worker that answered the
  // head (its thread waits for the last reference, which the middleman holds until it
  // stops, after that wait). Nothing of a node needs flushing: past a grace period the
  // process ends anyway.
  std::thread([result] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    std::fprintf(stderr, "troupe node: the actor system did not stop within 3 s; exiting\n");
    std::_Exit(result);
  }).detach();
  return result;
}

}  // namespace troupe::actors::cluster
