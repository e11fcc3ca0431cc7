#include "worker/backend_factory.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "cpu/cpu_backend.hpp"
#include "model/tensor_parallel.hpp"
#ifdef TROUPE_HAVE_GLOO
#include "cpu/gloo_communicator.hpp"
#endif
#ifdef TROUPE_HAVE_CUDA
#include "gpu/cuda_backend.hpp"
#endif
#ifdef TROUPE_HAVE_NCCL
#include "gpu/nccl_communicator.hpp"
#endif

namespace troupe::worker {

engine::WorkerSpec spec_for(const EngineConfig& config, std::string model_path,
                            std::int32_t max_model_len) {
  engine::WorkerSpec spec;
  spec.model_path = std::move(model_path);
  spec.device = config.device;
  spec.num_threads = config.num_threads;
  spec.cuda_graphs = config.cuda_graphs;
  spec.block_size = config.block_size;
  spec.max_model_len = max_model_len;
  spec.max_num_seqs = config.max_num_seqs;
  spec.max_num_batched_tokens = config.max_num_batched_tokens;
  spec.calibrate_step_cost = config.auto_token_budget && config.mode == BatchingMode::continuous;
  spec.num_kv_blocks = config.num_kv_blocks;
  spec.kv_cache_bytes = config.kv_cache_bytes;
  spec.gpu_memory_utilization = config.gpu_memory_utilization;
  spec.kv_cache_dtype = config.kv_cache_dtype;
  if (config.speculative.enabled()) {
    spec.draft_model_path = config.speculative.draft_model;
    spec.draft_num_threads = config.speculative.draft_num_threads;
  }
  spec.lora_adapters = config.lora_adapters;
  spec.pipeline_size = config.pipeline_parallel_size;
  spec.layer_partition = config.pipeline_layer_partition;
  return spec;
}

Result<std::unique_ptr<model::Backend>> make_backend(const engine::WorkerSpec& spec,
                                                     const model::Backend* beside) {
  if (spec.device == Device::cpu) {
    if (const auto* cpu = dynamic_cast<const cpu::CpuBackend*>(beside)) {
      return std::make_unique<cpu::CpuBackend>(cpu->thread_pool());
    }
    return std::make_unique<cpu::CpuBackend>(spec.num_threads);
  }
#ifdef TROUPE_HAVE_CUDA
  gpu::CudaBackendOptions options;
  options.device = spec.device_index;
  options.cuda_graphs = spec.cuda_graphs;
  options.max_graph_batch = std::min(spec.max_num_seqs, 256);
  options.max_model_len = spec.max_model_len;
  TROUPE_TRY(auto backend, gpu::CudaBackend::create(options));
  return std::unique_ptr<model::Backend>(std::move(backend));
#else
  return make_error(ErrorCode::unsupported,
                    "this troupe was built without CUDA (no nvcc when it was configured)");
#endif
}

std::vector<GpuInfo> list_gpus() {
  std::vector<GpuInfo> gpus;
#ifdef TROUPE_HAVE_CUDA
  for (int i = 0;; ++i) {
    auto device = gpu::probe_device(i);
    if (!device) break;
    gpus.push_back({device->name, device->total_bytes});
  }
#endif
  return gpus;
}

Result<void> check_model(const engine::WorkerSpec& spec, const model::LlamaConfig& config) {
#ifdef TROUPE_HAVE_CUDA
  if (spec.device == Device::cuda) {
    return gpu::CudaBackend::check_heads(config.num_heads, config.num_kv_heads, config.head_dim);
  }
#endif
  (void)spec, (void)config;
  return {};
}

Result<std::shared_ptr<model::Communicator>> connect_group(const engine::WorkerSpec& spec,
                                                           const GroupLink& link) {
  if (link.store == nullptr) {
    return make_error(ErrorCode::invalid_argument, "a rank of a group needs a rendezvous store");
  }
  if (spec.device == Device::cuda) {
#if defined(TROUPE_HAVE_CUDA) && defined(TROUPE_HAVE_NCCL)
    TROUPE_TRY(auto group,
               gpu::NcclCommunicator::connect(*link.store, spec.rank, spec.world_size,
                                              spec.device_index, link.prefix, link.timeout));
    return std::shared_ptr<model::Communicator>(std::move(group));
#else
    return make_error(ErrorCode::unsupported,
                      "this troupe was built without NCCL, which CUDA ranks of a group need");
#endif
  }
#ifdef TROUPE_HAVE_GLOO
  cpu::GlooOptions options;
  options.host = link.host;
  options.prefix = link.prefix;
  options.timeout = link.timeout;
  options.within_node = link.within_node;
  TROUPE_TRY(auto group,
             cpu::GlooCommunicator::connect(*link.store, spec.rank, spec.world_size, options));
  return std::shared_ptr<model::Communicator>(std::move(group));
#else
  return make_error(ErrorCode::unsupported,
                    "this troupe was built without Gloo (libgloo-dev), which CPU ranks need");
#endif
}

namespace {

// A cgroup limit file's value in bytes; 0 for none ("max", or v1's huge "no limit").
std::int64_t cgroup_limit(const std::string& path) {
  std::ifstream file(path);
  std::string text;
  if (!(file >> text) || text == "max") return 0;
  try {
    const long long value = std::stoll(text);
    return value > 0 && value < (std::int64_t{1} << 60) ? value : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

// The memory this process may use: the machine's, or its cgroup's limit where lower (a
// container's): cgroup v2 at this process's own cgroup and its ancestors (from
// /proc/self/cgroup), or v1's memory controller. 0 when unknown.
std::int64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  std::int64_t bytes = pages > 0 && page > 0 ? static_cast<std::int64_t>(pages) * page : 0;
  const auto lower = [&](std::int64_t limit) {
    if (limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;
  };
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  while (std::getline(self, line)) {
    if (line.rfind("0::", 0) == 0) {  // v2: "0::/path"
      std::string dir = line.substr(3);
      while (true) {
        lower(cgroup_limit("/sys/fs/cgroup" + dir + "/memory.max"));
        if (dir.empty() || dir == "/") break;
        dir = dir.substr(0, dir.rfind('/'));
      }
    }
  }
  lower(cgroup_limit("/sys/fs/cgroup/memory.max"));                    // a namespaced v2 cgroup
  lower(cgroup_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes"));  // v1
  return bytes;
}

}  // namespace

Result<std::shared_ptr<const model::LoraAdapter>> read_adapter(const model::LoadedModel& m,
                                                               const std::string& path) {
  TROUPE_TRY(auto adapter, model::LoraAdapter::open(path, *m.file, m.config));
  return std::make_shared<const model::LoraAdapter>(std::move(adapter));
}

namespace {

// The spec's LoRA adapters, read and checked against the model before its weights load
// (null for an empty slot: an empty path).
Result<std::vector<std::shared_ptr<const model::LoraAdapter>>> read_adapters(
    const engine::WorkerSpec& spec, const model::LoadedModel& m) {
  std::vector<std::shared_ptr<const model::LoraAdapter>> adapters;
  if (spec.lora_adapters.empty()) return adapters;
  for (const auto& path : spec.lora_adapters) {
    if (path.empty()) {
      adapters.push_back(nullptr);
      continue;
    }
    TROUPE_TRY(auto adapter, read_adapter(m, path));
    adapters.push_back(std::move(adapter));
  }
  return adapters;
}

}  // namespace

Result<model::LoadedModel> open_model(const engine::WorkerSpec& spec, const GroupLink* link,
                                      const model::LoadProgress& progress,
                                      const model::Backend* beside, std::int64_t mapped_beside) {
  // Everything that can refuse the model comes before the weights are loaded.
  TROUPE_TRY(auto m, model::LoadedModel::open(spec.model_path));
  if (!spec.model_fingerprint.empty()) {
    const std::string fingerprint = model::file_fingerprint(*m.file);
    if (fingerprint != spec.model_fingerprint) {
      return make_error(ErrorCode::invalid_file,
                        spec.model_path + " is not the engine's model file (fingerprint " +
                            fingerprint + ", expected " + spec.model_fingerprint + ")");
    }
  }
  model::Shard shard{spec.rank, spec.world_size};
  TROUPE_TRY(const auto layout, model::shard_layout(m.config, shard));
  TROUPE_TRY_VOID(check_model(spec, model::local_config(m.config, layout)));
  if (spec.pipeline_size > 1 || !spec.layer_partition.empty()) {
    TROUPE_TRY(shard.stage, model::pipeline_stage(m.config.num_layers, spec.pipeline_stage,
                                                  spec.pipeline_size, spec.layer_partition));
  }
  if (spec.device == Device::cpu) {  // mapped weights live in host memory
    TROUPE_TRY_VOID(model::check_weights_fit(*m.file, m.config,
                                             spec.world_size * std::max(1, spec.pipeline_size),
                                             host_memory_bytes(), mapped_beside));
  }
  if (spec.device == Device::cuda && spec.kv_cache_dtype == KvCacheDtype::f32) {
    return make_error(ErrorCode::unsupported,
                      "--kv-cache-dtype f32 is for the CPU; the CUDA backend keeps its KV cache "
                      "in F16");
  }
  TROUPE_TRY(auto adapters, read_adapters(spec, m));
  TROUPE_TRY(auto backend, make_backend(spec, beside));
  std::shared_ptr<model::Communicator> pipe;
  if (shard.is_staged()) {
    TROUPE_TRY_VOID(backend->supports_pipeline_stage());
    if (link == nullptr) {
      return make_error(ErrorCode::invalid_argument,
                        "pipeline stage " + std::to_string(spec.pipeline_stage) + " of " +
                            std::to_string(spec.pipeline_size) + " was given no pipeline to join");
    }
    // The stages meet as a group's ranks do: rank i is stage i (the hidden states pass
    // through host memory: a CUDA pipe would need a Gloo link, as CPU ranks have, and CUDA
    // stages are refused above for now). Where each stage is a
    // tensor-parallel group, rank r of every stage is on a pipe of its own (the hidden
    // states are whole on every rank: each passes them to its peer of the next stage).
    engine::WorkerSpec as_rank = spec;
    as_rank.rank = spec.pipeline_stage;
    as_rank.world_size = spec.pipeline_size;
    GroupLink pipe_link = *link;
    if (shard.is_split()) pipe_link.prefix += "/pipe" + std::to_string(spec.rank);
    TROUPE_TRY(pipe, connect_group(as_rank, pipe_link));
  }
  if (shard.is_split()) {
    if (link == nullptr) {
      return make_error(ErrorCode::invalid_argument, "rank " + std::to_string(spec.rank) + " of " +
                                                         std::to_string(spec.world_size) +
                                                         " was given no group to join");
    }
    // Each stage of a pipeline is a tensor-parallel group of its own.
    GroupLink group_link = *link;
    if (shard.is_staged()) {
      group_link.prefix += "/stage" + std::to_string(spec.pipeline_stage);
      group_link.within_node = true;  // a stage's ranks are placed on one node
    }
    TROUPE_TRY(m.group, connect_group(spec, group_link));
    TROUPE_TRY_VOID(backend->join_group(m.group));
  }
  TROUPE_TRY_VOID(m.load_weights(std::move(backend), shard, progress));
  if (pipe != nullptr) TROUPE_TRY_VOID(m.model->join_pipeline(pipe));
  m.pipe = std::move(pipe);
  for (std::size_t i = 0; i < adapters.size(); ++i) {
    if (adapters[i] == nullptr) continue;
    TROUPE_TRY_VOID(m.model->set_adapter(static_cast<std::int32_t>(i + 1), std::move(adapters[i])));
  }
  m.kv_dtype = spec.kv_cache_dtype.value_or(KvCacheDtype::f16);
  return m;
}

}  // namespace troupe::worker
