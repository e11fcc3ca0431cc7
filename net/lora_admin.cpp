#include "net/lora_admin.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <filesystem>

#include "gguf/gguf_file.hpp"
#include "monitoring/metrics.hpp"
#include "text/unicode.hpp"

namespace troupe::net {

namespace {

namespace json = boost::json;

tl::expected<void, ApiError> check_enabled(const ServerConfig& config) {
  if (config.runtime_lora_updating) return {};
  return tl::unexpected(bad_request(
      "loading and unloading LoRA adapters while serving is off: start troupe serve with "
      "--enable-runtime-lora-updating (or with VLLM_ALLOW_RUNTIME_LORA_UPDATING=true set)"));
}

// The body's string fields, each required and non-empty.
tl::expected<std::vector<std::string>, ApiError> read_fields(
    std::string_view body, std::initializer_list<std::string_view> names) {
  json::error_code ec;
  const json::value v = json::parse(body, ec);
  if (ec) return tl::unexpected(bad_request("the body is not valid JSON: " + ec.message()));
  if (!v.is_object()) return tl::unexpected(bad_request("the body must be a JSON object"));
  std::vector<std::string> out;
  for (const std::string_view name : names) {
    const auto* field = v.as_object().if_contains(name);
    if (field == nullptr || !field->is_string() || field->get_string().empty()) {
      return tl::unexpected(
          bad_request("'" + std::string(name) + "' must be a non-empty string", std::string(name)));
    }
    out.emplace_back(field->get_string());
  }
  return out;
}

// What --lora-modules checks of an adapter file before the workers read it (they check
// it against the model): it is here, a LoRA adapter GGUF, of rank at most the limit.
tl::expected<void, ApiError> check_file(const std::string& name, const std::string& path,
                                        std::int32_t max_lora_rank) {
  const std::string which = "LoRA adapter '" + name + "' (" + path + ")";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return tl::unexpected(bad_request(which + ": no such file", "lora_path"));
  }
  auto file = gguf::GgufFile::open(path);
  if (!file) return tl::unexpected(bad_request(which + ": " + file.error().message, "lora_path"));
  const auto type = file->get_string("general.type");
  const auto adapter_type = file->get_string("adapter.type");
  if (!type || *type != "adapter" || !adapter_type || *adapter_type != "lora") {
    return tl::unexpected(
        bad_request(which + " is not a LoRA adapter GGUF (general.type adapter, adapter.type lora)",
                    "lora_path"));
  }
  std::int64_t rank = 0;
  for (const auto& t : file->tensors()) {
    if (t.name.ends_with(".lora_a")) rank = std::max(rank, t.dims[1]);
  }
  if (rank > max_lora_rank) {
    return tl::unexpected(bad_request(which + " has rank " + std::to_string(rank) +
                                          ", more than --max-lora-rank " +
                                          std::to_string(max_lora_rank),
                                      "lora_path"));
  }
  return {};
}

}  // namespace

tl::expected<std::string, ApiError> LoraAdmin::load(std::string_view body) const {
  if (auto off = check_enabled(config); !off) return tl::unexpected(off.error());
  auto fields = read_fields(body, {"lora_name", "lora_path"});
  if (!fields) return tl::unexpected(fields.error());
  const std::string name = text::to_valid_utf8((*fields)[0]);
  const std::string path = (*fields)[1];
  if (context.is_base_name(name)) {
    return tl::unexpected(
        bad_request("the name '" + name + "' is the served model's", "lora_name"));
  }
  // Held from here to the end: a second load of the name meanwhile is refused.
  if (!context.loras->hold(name)) {
    return tl::unexpected(
        bad_request("The lora adapter '" + name + "' has already been loaded.", "lora_name"));
  }
  struct LetGo {
    LoraTable& table;
    const std::string& name;
    ~LetGo() { table.let_go(name); }
  } let_go{*context.loras, name};
  if (auto bad = check_file(name, path, config.max_lora_rank); !bad) {
    return tl::unexpected(bad.error());
  }
  auto slot = engine.load_lora_adapter(path);
  if (!slot) {
    return tl::unexpected(
        bad_request("LoRA adapter '" + name + "': " + slot.error().message,
                    slot.error().code == ErrorCode::out_of_range ? "" : "lora_path"));
  }
  context.loras->add({name, text::to_valid_utf8(path), *slot});
  if (config.metrics) config.metrics->name_lora_adapter(*slot, name);
  return "Success: LoRA adapter '" + name + "' added successfully.";
}

tl::expected<std::string, ApiError> LoraAdmin::unload(std::string_view body) const {
  if (auto off = check_enabled(config); !off) return tl::unexpected(off.error());
  auto fields = read_fields(body, {"lora_name"});
  if (!fields) return tl::unexpected(fields.error());
  const std::string name = text::to_valid_utf8((*fields)[0]);
  const auto removed = context.loras->remove(name);
  if (!removed) {
    return tl::unexpected(ApiError{404, "The lora adapter '" + name + "' cannot be found.",
                                   "NotFoundError", "lora_name"});
  }
  if (config.metrics) config.metrics->name_lora_adapter(removed->slot, "");
  if (auto unloaded = engine.unload_lora_adapter(removed->slot); !unloaded) {
    return tl::unexpected(ApiError{500, unloaded.error().message, "InternalServerError", ""});
  }
  return "Success: LoRA adapter '" + name + "' removed successfully.";
}

}  // namespace troupe::net
