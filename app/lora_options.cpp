#include "app/lora_options.hpp"

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "gguf/gguf_file.hpp"

namespace troupe::app {

namespace {

Error lora_error(const std::string& message) {
  return Error{ErrorCode::invalid_argument, "--lora-modules: " + message};
}

// The largest rank among the adapter's matrices (lora_a is [n_in, rank] in ggml order),
// once the file is known to be a LoRA adapter GGUF.
Result<std::int64_t> adapter_rank(const std::string& name, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return tl::unexpected(lora_error("adapter '" + name + "': no file " + path));
  }
  auto file = gguf::GgufFile::open(path);
  if (!file) {
    return tl::unexpected(
        lora_error("adapter '" + name + "' (" + path + "): " + file.error().message));
  }
  const auto type = file->get_string("general.type");
  const auto adapter_type = file->get_string("adapter.type");
  if (!type || *type != "adapter" || !adapter_type || *adapter_type != "lora") {
    return tl::unexpected(lora_error("adapter '" + name + "' (" + path +
                                     ") is not a LoRA adapter GGUF (general.type adapter, "
                                     "adapter.type lora)"));
  }
  std::int64_t rank = 0;
  for (const auto& t : file->tensors()) {
    if (t.name.ends_with(".lora_a")) rank = std::max(rank, t.dims[1]);
  }
  return rank;
}

}  // namespace

void add_lora_options(CLI::App* cmd, LoraFlags& flags) {
  cmd->add_option("--lora-modules", flags.modules,
                  "LoRA adapters served beside the model, each as name=path or vLLM's JSON "
                  "{\"name\": ..., \"path\": ..., \"base_model_name\": ...}; a request whose "
                  "model is the name runs with that adapter")
      ->expected(1, CLI::detail::expected_max_vector_size)
      ->type_name("NAME=PATH");
  cmd->add_option("--max-loras", flags.max_loras,
                  "LoRA adapters resident at once, those of --lora-modules and those loaded "
                  "while serving together; every adapter is resident, so at most this many "
                  "may be given")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--max-lora-rank", flags.max_lora_rank,
                  "the largest LoRA rank an adapter may have")
      ->check(CLI::Range(1, 65536));
  cmd->add_flag("--enable-runtime-lora-updating", flags.runtime_updating,
                "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's; also on "
                "with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true): adapters loaded while serving "
                "take free --max-loras slots");
}

Result<net::ServerConfig::LoraModule> parse_lora_module(const std::string& item,
                                                        const std::string& base_name) {
  net::ServerConfig::LoraModule module;
  if (!item.empty() && item.front() == '{') {
    boost::json::error_code ec;
    const boost::json::value v = boost::json::parse(item, ec);
    if (ec || !v.is_object()) {
      return tl::unexpected(lora_error("'" + item + "' is not a JSON object"));
    }
    const auto& o = v.as_object();
    for (const auto& [key, value] : o) {
      if (key != "name" && key != "path" && key != "base_model_name") {
        return tl::unexpected(lora_error("'" + item + "': unknown key '" + std::string(key) +
                                         "' (name, path, base_model_name)"));
      }
      if (!value.is_string()) {
        return tl::unexpected(
            lora_error("'" + item + "': " + std::string(key) + " must be a string"));
      }
    }
    if (const auto* n = o.if_contains("name")) module.name = std::string(n->get_string());
    if (const auto* p = o.if_contains("path")) module.path = std::string(p->get_string());
    if (const auto* b = o.if_contains("base_model_name")) {
      if (b->get_string() != base_name) {
        return tl::unexpected(lora_error("'" + item + "': base_model_name '" +
                                         std::string(b->get_string()) +
                                         "' is not the served model ('" + base_name + "')"));
      }
    }
  } else {
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      return tl::unexpected(lora_error("'" + item + "' is neither name=path nor a JSON object"));
    }
    module.name = item.substr(0, eq);
    module.path = item.substr(eq + 1);
  }
  if (module.name.empty() || module.path.empty()) {
    return tl::unexpected(lora_error("'" + item + "' needs a name and a path"));
  }
  return module;
}

bool runtime_lora_env(const char* value) {
  if (value == nullptr) return false;
  std::string v(value);
  const auto first = v.find_first_not_of(" \t");
  const auto last = v.find_last_not_of(" \t");
  v = first == std::string::npos ? "" : v.substr(first, last - first + 1);
  std::transform(v.begin(), v.end(), v.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return v == "1" || v == "true";
}

Result<void> settle_lora(const LoraFlags& flags, net::ServerConfig& server, EngineConfig& engine) {
  server.runtime_lora_updating =
      flags.runtime_updating || runtime_lora_env(std::getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"));
  server.max_lora_rank = flags.max_lora_rank;
  engine.max_loras = flags.max_loras;
  if (flags.modules.empty()) return {};
  if (static_cast<std::int64_t>(flags.modules.size()) > flags.max_loras) {
    return tl::unexpected(lora_error(
        std::to_string(flags.modules.size()) + " adapters, more than --max-loras " +
        std::to_string(flags.max_loras) + " (every adapter stays resident; raise --max-loras)"));
  }
  std::set<std::string> names{server.served_model_name};
  names.insert(server.other_model_names.begin(), server.other_model_names.end());
  for (const auto& item : flags.modules) {
    auto module = parse_lora_module(item, server.served_model_name);
    if (!module) return tl::unexpected(module.error());
    if (names.count(module->name) > 0) {
      const bool base = module->name == server.served_model_name ||
                        std::find(server.other_model_names.begin(), server.other_model_names.end(),
                                  module->name) != server.other_model_names.end();
      return tl::unexpected(lora_error("the name '" + module->name + "' is " +
                                       (base ? "the served model's" : "given twice")));
    }
    names.insert(module->name);
    auto rank = adapter_rank(module->name, module->path);
    if (!rank) return tl::unexpected(rank.error());
    if (*rank > flags.max_lora_rank) {
      return tl::unexpected(lora_error("adapter '" + module->name + "' has rank " +
                                       std::to_string(*rank) + ", more than --max-lora-rank " +
                                       std::to_string(flags.max_lora_rank)));
    }
    engine.lora_adapters.push_back(module->path);
    server.lora_modules.push_back(std::move(*module));
  }
  return {};
}

}  // namespace troupe::app
