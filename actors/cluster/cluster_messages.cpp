#include "actors/cluster/cluster_messages.hpp"
#include "monitoring/log.hpp"

#include "actors/cluster/tls_error_queue.hpp"

#include <algorithm>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <cstdio>

namespace troupe::actors::cluster {

void add_cluster_types(caf::actor_system_config& config) {
  config.add_message_type<NodeInfo>("troupe.NodeInfo")
      .add_message_type<JoinReply>("troupe.JoinReply")
      .add_message_type<NodeView>("troupe.NodeView")
      .add_message_type<std::vector<NodeView>>("troupe.NodeViews")
      .add_message_type<Placement>("troupe.Placement")
      .add_message_type<worker_actor>(kWorkerType)
      .add_message_type<registry_actor>("troupe.registry");
}

std::string check_tls_files(const TlsFiles& tls) {
  if (!tls.enabled()) return "";
  const std::pair<const char*, const std::string*> files[] = {
      {"certificate", &tls.certificate}, {"key", &tls.key}, {"CA", &tls.ca}};
  for (const auto& [what, path] : files) {
    if (path->empty())
      return std::string("TLS needs a certificate, a key and a CA; the ") + what + " is missing";
    if (std::FILE* f = std::fopen(path->c_str(), "r")) {
      std::fclose(f);
    } else {
      return std::string("cannot read the TLS ") + what + " " + *path;
    }
  }
  return "";
}

void load_middleman(caf::actor_system_config& config, const TlsFiles& tls) {
  config.load<caf::io::middleman>();
  // Every peer must send heartbeats, or an idle healthy one is dropped (STACK.md).
  config.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(500)});
  config.set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(3)});
  if (tls.enabled()) {
    // With a certificate, a key and a CA on both sides the link is mutual TLS: a peer
    // without a certificate from that CA fails the handshake (STACK.md).
    config.load<caf::openssl::manager>();
    config.openssl_certificate = tls.certificate;
    config.openssl_key = tls.key;
    config.openssl_cafile = tls.ca;
    if (!tls_error_queue_guarded()) {
      monitoring::log_warning(
          "OpenSSL's error queue is not cleared before TLS reads; a failed handshake may drop "
          "healthy cluster links");
    }
  }
}

void unpublish_registry(const registry_actor& registry, std::uint16_t port, const TlsFiles& tls) {
  if (tls.enabled()) {
    // (caf/openssl/unpublish.hpp names an atom CAF 0.17 does not have: the same request
    // to the OpenSSL manager, spelled for 0.17.)
    auto manager = caf::make_function_view(registry.home_system().openssl_manager().actor_handle());
    manager(caf::unpublish_atom::value, registry.address(), port);
  } else {
    registry.home_system().middleman().unpublish(registry, port);
  }
}

caf::expected<registry_actor> connect_registry(caf::actor_system& system, const std::string& host,
                                               std::uint16_t port, const TlsFiles& tls) {
  if (tls.enabled()) return caf::openssl::remote_actor<registry_actor>(system, host, port);
  return system.middleman().remote_actor<registry_actor>(host, port);
}

std::string node_label(const std::vector<std::string>& nodes) {
  std::string label;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (std::find(nodes.begin(), nodes.begin() + static_cast<std::ptrdiff_t>(i), nodes[i]) !=
        nodes.begin() + static_cast<std::ptrdiff_t>(i)) {
      continue;  // named already
    }
    label += (label.empty() ? "" : ",") + nodes[i];
  }
  return label;
}

}  // namespace troupe::actors::cluster
