#include <CLI/CLI.hpp>

#include "app/commands.hpp"
#include "troupe/engine.hpp"

namespace troupe::app {

void add_device_options(CLI::App* cmd, EngineConfig& engine) {
  static const std::map<std::string, Device> kDevices = {{"cpu", Device::cpu},
                                                         {"cuda", Device::cuda}};
  cmd->add_option("--device", engine.device, "where the model runs: cpu or cuda")
      ->transform(CLI::CheckedTransformer(kDevices, CLI::ignore_case));
  cmd->add_option("--gpu-memory-utilization", engine.gpu_memory_utilization,
                  "cuda: share of the GPU memory left after the weights for the KV cache")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_flag("--enforce-eager{false}", engine.cuda_graphs,
                "cuda: run every step eagerly (no CUDA graphs)");
}

void add_cluster_tls_options(CLI::App* cmd, std::string& certificate, std::string& key,
                             std::string& ca) {
  cmd->add_option("--cluster-tls-cert", certificate,
                  "mutual TLS on the cluster link: this side's certificate (PEM)");
  cmd->add_option("--cluster-tls-key", key, "mutual TLS: its private key");
  cmd->add_option("--cluster-tls-ca", ca,
                  "mutual TLS: the authority the other side's certificate must be signed by");
}

}  // namespace troupe::app
