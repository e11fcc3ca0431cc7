// What the head and its nodes say to each other. A node joins the head's registry
// with its resources and the cluster token; the head spawns workers on it by name
// (kWorkerType) and places replicas through the registry. Plain values only: they
// cross the network (both ends register them: add_cluster_types).
#pragma once

#include <algorithm>
#include <caf/all.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/messages.hpp"

namespace troupe::actors::cluster {

using join_atom = caf::atom_constant<caf::atom("join")>;
using place_atom = caf::atom_constant<caf::atom("place")>;
using nodes_atom = caf::atom_constant<caf::atom("nodes")>;
using unfit_atom = caf::atom_constant<caf::atom("unfit")>;
// The head to a drained node's keeper: its replicas have moved off; it may exit.
using release_atom = caf::atom_constant<caf::atom("release")>;
// An elastic replica left with its node (lost, or drained): what it held is free.
using retired_atom = caf::atom_constant<caf::atom("retired")>;

// What a drain asked by name answers (POST /v1/cluster/nodes/{name}/drain).
enum class DrainAnswer : std::int32_t { started = 0, already = 1, unknown = 2 };

// The name a node offers the worker actor under, for remote spawn.
inline constexpr const char* kWorkerType = "troupe.worker";

// A node's resources, as it announces them when it joins.
struct NodeInfo {
  std::string name;
  std::string token;  // the cluster token: the head refuses a node without it
  std::int32_t num_cores = 0;
  std::int64_t memory_bytes = 0;
  std::string device;  // "cpu" or "cuda"
  std::vector<std::string> gpu_names;
  std::vector<std::int64_t> gpu_memory_bytes;
  std::int32_t num_threads = 0;  // compute threads a worker there gets (0: all cores)
  std::string collective_host;   // where other nodes' ranks of a group reach its ranks
  // How long a drain of this node lets its running requests finish (--shutdown-timeout).
  std::int64_t shutdown_timeout_ms = 30000;

  // How many workers (ranks) it can hold: one per GPU; on CPUs, as many as its cores
  // give threads (a worker with all the cores fills it).
  std::int32_t num_slots() const {
    if (device == "cuda")
      return std::max<std::int32_t>(1, static_cast<std::int32_t>(gpu_names.size()));
    if (num_threads <= 0) return 1;
    return std::max<std::int32_t>(1, num_cores / num_threads);
  }
};

struct JoinReply {
  bool accepted = false;
  std::string message;  // why not, or the head's welcome
};

// A node as the head sees it (GET /v1/cluster, the join log).
struct NodeView {
  NodeInfo info;  // without the token
  std::string address;
  std::int32_t replica = -1;           // the (first) replica whose worker runs there (-1: none)
  std::string unfit;                   // why no worker is placed there (empty: it is fit)
  std::vector<std::int32_t> replicas;  // the replica of each worker (rank) it holds
  std::int32_t slots = 1;              // how many it can hold
  bool draining = false;               // its replicas move off; then it is released
};

// The workers placed for a replica: one, or a tensor-parallel group's ranks in order.
struct Placement {
  std::vector<worker_actor> workers;
  std::vector<std::string> nodes;  // each one's node (by name)
};

// A placement's nodes for people: each name once, in rank order ("n0,n1").
std::string node_label(const std::vector<std::string>& nodes);

// The head's registry: nodes join it, and replicas are placed through it.
using registry_actor = caf::typed_actor<
    // A node joins (with its keeper, whose loss is the node's); refused without the token.
    caf::replies_to<join_atom, NodeInfo, caf::actor>::with<JoinReply>,
    // Workers for this replica's ranks (one node for all of them when one has the room,
    // as vLLM places a group; else spread; with a stage size k > 0, a pipeline's stages of
    // k ranks, one node each); answered once they can be placed.
    caf::replies_to<place_atom, std::int32_t, std::int32_t, std::int32_t>::with<Placement>,
    // The nodes that have joined.
    caf::replies_to<nodes_atom>::with<std::vector<NodeView>>,
    // A node whose worker could not load (another model file, too little memory): no
    // replica is placed there again.
    caf::reacts_to<unfit_atom, std::string, std::string>,
    // The head drains a node by name (a DrainAnswer, as an int32); a node drains itself
    // (its SIGTERM). Its replicas stop taking requests and move off, then the node's
    // keeper hears release_atom. No replica is placed on a draining node.
    caf::replies_to<drain_atom, std::string>::with<std::int32_t>, caf::reacts_to<drain_atom>,
    // A replica's drain off a node is over: its worker ended (the replica's index, the
    // node's name).
    caf::reacts_to<drained_atom, std::int32_t, std::string>,
    // An elastic replica (its index) left: the slots it held on any node are free, and a
    // drained node it was the last on is released.
    caf::reacts_to<retired_atom, std::int32_t>,
    // The replicas' schedulers by index (replica_actor handles; null: none there now), for
    // drains to reach. Sent again as elastic replicas come and go.
    caf::reacts_to<replicas_atom, std::vector<caf::actor>>>;

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NodeInfo& x) {
  return f(caf::meta::type_name("troupe.NodeInfo"), x.name, x.token, x.num_cores, x.memory_bytes,
           x.device, x.gpu_names, x.gpu_memory_bytes, x.num_threads, x.collective_host,
           x.shutdown_timeout_ms);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JoinReply& x) {
  return f(caf::meta::type_name("troupe.JoinReply"), x.accepted, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NodeView& x) {
  return f(caf::meta::type_name("troupe.NodeView"), x.info, x.address, x.replica, x.unfit,
           x.replicas, x.slots, x.draining);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Placement& x) {
  return f(caf::meta::type_name("troupe.Placement"), x.workers, x.nodes);
}

// Registers the cluster's messages (and the worker's handle type) on a head or a node.
void add_cluster_types(caf::actor_system_config& config);

// PEM files for mutual TLS: all three, or none (plain BASP, for loopback or a private
// network).
struct TlsFiles {
  std::string certificate;
  std::string key;
  std::string ca;
  bool enabled() const { return !certificate.empty() || !key.empty() || !ca.empty(); }
};

// Why these files cannot be used (one missing, or unreadable); empty when they can.
std::string check_tls_files(const TlsFiles& tls);

// The middleman and its settings: heartbeats both ways, so that a hung peer is found;
// and CAF's OpenSSL module with these files when TLS is enabled.
void load_middleman(caf::actor_system_config& config, const TlsFiles& tls);

// Takes the registry off the cluster port (cluster_port.hpp publishes it). Before the head's actor
// system ends: a published detached actor keeps a reference in the middleman, and ~actor_system can
// wait for it forever (STACK.md, "shutdown hang").
void unpublish_registry(const registry_actor& registry, std::uint16_t port, const TlsFiles& tls);

// A head's registry, from a node (over TLS when `tls` is enabled).
caf::expected<registry_actor> connect_registry(caf::actor_system& system, const std::string& host,
                                               std::uint16_t port, const TlsFiles& tls);

}  // namespace troupe::actors::cluster
