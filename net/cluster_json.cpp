#include "net/cluster_json.hpp"

#include <boost/json.hpp>
#include <charconv>
#include <cmath>

namespace troupe::net {

namespace json = boost::json;

namespace {

// JSON text as boost::json::serialize writes it, but for doubles: those are written in
// plain decimal (0, 0.25), not in the exponent form Boost 1.81 gives every double (0E0,
// 2.5E-1), which readers and people take for a string or a typo.
void write_plain(const json::value& v, std::string& out) {
  switch (v.kind()) {
    case json::kind::double_: {
      const double d = v.get_double();
      if (!std::isfinite(d)) {
        out += "null";
        return;
      }
      char digits[400];
      const auto end = std::to_chars(digits, digits + sizeof digits, d, std::chars_format::fixed);
      out.append(digits, end.ptr);
      return;
    }
    case json::kind::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.get_object()) {
        if (!first) out += ',';
        first = false;
        out += json::serialize(json::string_view(key));
        out += ':';
        write_plain(item, out);
      }
      out += '}';
      return;
    }
    case json::kind::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v.get_array()) {
        if (!first) out += ',';
        first = false;
        write_plain(item, out);
      }
      out += ']';
      return;
    }
    default:
      out += json::serialize(v);
  }
}

}  // namespace

namespace {

// The most replicas: null where there is no cap (auto).
json::value max_of(const ReplicaCount& count) {
  if (count.max == EngineConfig::kUnboundedReplicas) return nullptr;
  return count.max;
}

}  // namespace

std::string health_json(const ReplicaCount& count) {
  return json::serialize(json::object{{"status", count.up > 0 ? "ok" : "unavailable"},
                                      {"replicas_up", count.up},
                                      {"replicas", count.current},
                                      {"replicas_min", count.min},
                                      {"replicas_max", max_of(count)}});
}

namespace {

json::array gpus_of(const NodeStatus& n) {
  json::array gpus;
  for (std::size_t i = 0; i < n.gpu_names.size(); ++i) {
    gpus.emplace_back(
        json::object{{"name", n.gpu_names[i]},
                     {"memory_bytes", i < n.gpu_memory_bytes.size() ? n.gpu_memory_bytes[i] : 0}});
  }
  return gpus;
}

// A replica's workers: each one's node and layers [begin, end), its tensor-parallel rank
// and pipeline stage (null where the replica is not split that way).
json::array workers_of(const ReplicaStats& r) {
  json::array workers;
  auto or_null = [](std::int32_t v) -> json::value {
    if (v < 0) return nullptr;
    return v;
  };
  for (const ReplicaWorker& w : r.workers) {
    workers.emplace_back(json::object{{"node", w.node},
                                      {"rank", or_null(w.rank)},
                                      {"stage", or_null(w.stage)},
                                      {"layers", json::array{w.layer_begin, w.layer_end}}});
  }
  return workers;
}

}  // namespace

std::string cluster_json(const std::vector<NodeStatus>& nodes,
                         const std::vector<ReplicaStats>& replicas, const ReplicaCount& count) {
  json::array node_list;
  for (const NodeStatus& n : nodes) {
    node_list.emplace_back(json::object{{"name", n.name},
                                        {"id", n.id},
                                        {"device", n.device},
                                        {"cores", n.num_cores},
                                        {"memory_bytes", n.memory_bytes},
                                        {"gpus", gpus_of(n)},
                                        {"replica", n.replica},
                                        {"ranks", n.num_ranks},
                                        {"slots", n.num_slots},
                                        {"collective_host", n.collective_host},
                                        {"unfit", n.unfit},
                                        {"draining", n.draining}});
  }
  json::array replica_list;
  for (const ReplicaStats& r : replicas) {
    const EngineStats& s = r.stats;
    replica_list.emplace_back(json::object{{"index", r.index},
                                           {"up", r.up},
                                           {"state", r.state},
                                           {"node", r.node},
                                           {"num_routed", r.num_routed},
                                           {"num_prefix_routed", r.num_prefix_routed},
                                           {"num_running", s.num_running},
                                           {"num_waiting", s.num_waiting},
                                           {"kv_usage", s.kv_usage},
                                           {"num_kv_blocks", s.num_kv_blocks},
                                           {"prefix_cache_blocks", s.prefix_cache_blocks},
                                           {"prefix_hit_tokens", s.prefix_hit_tokens},
                                           {"prefix_queried_tokens", s.prefix_queried_tokens},
                                           {"num_worker_restarts", s.num_worker_restarts},
                                           {"workers", workers_of(r)}});
  }
  std::string out;
  json::object counted{{"up", count.up},
                       {"current", count.current},
                       {"min", count.min},
                       {"max", max_of(count)},
                       {"elastic", count.elastic}};
  write_plain(json::object{{"nodes", std::move(node_list)},
                           {"replicas", std::move(replica_list)},
                           {"replica_count", std::move(counted)}},
              out);
  return out;
}

}  // namespace troupe::net
