// The head's cluster port: the registry published behind a ClusterGate.
//
// CAF 0.17's publish() leaves every accepted connection to its BASP broker with no limit
// and no deadline: one that never speaks is held forever, and enough of them take every
// descriptor the HTTP server needs. So the head opens the port itself and gives the
// broker a doorman of its own (what CAF's middleman actor does for publish(), with CAF's
// acceptor and scribes): it accepts through the gate, closes at once what the gate
// refuses, and wraps each connection it lets in (plain, or in CAF's OpenSSL session) in a
// scribe that tells the gate of its end. The broker then speaks BASP over it as over any.
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "actors/cluster/cluster_gate.hpp"
#include "actors/cluster/cluster_messages.hpp"

namespace troupe::actors::cluster {

// The registry published on `host`:`port` (0: any free port) behind `gate`, over mutual
// TLS when `tls` is enabled; the port it listens on. unpublish_registry takes it off.
caf::expected<std::uint16_t> publish_registry(const registry_actor& registry, std::uint16_t port,
                                              const std::string& host, const TlsFiles& tls,
                                              std::shared_ptr<ClusterGate> gate);

}  // namespace troupe::actors::cluster
