// `troupe make-model`: writes a random-weight model (Llama, Qwen3, Qwen3-MoE) as a GGUF file.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <new>

#include "app/commands.hpp"
#include "model/random_model.hpp"

namespace troupe::app {

namespace {

const std::map<std::string, gguf::TensorType> kTypes = {
    {"f32", gguf::TensorType::f32},       {"f16", gguf::TensorType::f16},
    {"bf16", gguf::TensorType::bf16},     {"q8_0", gguf::TensorType::q8_0},
    {"q4_0", gguf::TensorType::q4_0},     {"q4_1", gguf::TensorType::q4_1},
    {"q5_0", gguf::TensorType::q5_0},     {"q5_1", gguf::TensorType::q5_1},
    {"q2_k", gguf::TensorType::q2_k},     {"q3_k", gguf::TensorType::q3_k},
    {"q4_k", gguf::TensorType::q4_k},     {"q5_k", gguf::TensorType::q5_k},
    {"q6_k", gguf::TensorType::q6_k},     {"iq4_nl", gguf::TensorType::iq4_nl},
    {"iq4_xs", gguf::TensorType::iq4_xs}, {"mxfp4", gguf::TensorType::mxfp4}};

// llama.cpp's file types that mix several (model::RandomModelSpec::Mix).
const std::map<std::string, model::RandomModelSpec::Mix> kMixes = {
    {"q4_k_m", model::RandomModelSpec::Mix::q4_k_m},
    {"q3_k_m", model::RandomModelSpec::Mix::q3_k_m},
    {"q2_k_mix", model::RandomModelSpec::Mix::q2_k}};

}  // namespace

std::string builtin_model_path() {
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::filesystem::path dir = cache && *cache ? std::filesystem::path(cache)
                              : home && *home ? std::filesystem::path(home) / ".cache"
                                              : std::filesystem::temp_directory_path();
  dir /= "troupe";
  const auto path = dir / "troupe-random-tiny-f32.gguf";
  if (std::filesystem::exists(path)) return path.string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "troupe: cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    return {};
  }
  std::fprintf(stderr, "troupe: writing the built-in random-weight model to %s\n", path.c_str());
  auto spec = model::random_model_preset("tiny");
  auto written = model::write_random_model(*spec, path.string());
  if (!written) {
    std::fprintf(stderr, "troupe: %s\n", written.error().message.c_str());
    return {};
  }
  return path.string();
}

void add_make_model_command(CLI::App& app) {
  struct Options {
    std::string out, preset = "tiny", type = "f32";
    model::RandomModelSpec spec;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("make-model",
                                 "write a random-weight model (GGUF): Llama, Qwen3 or Qwen3-MoE");
  cmd->add_option("--out,-o", opts->out, "file to write")->required();
  cmd->add_option("--preset", opts->preset,
                  "starting shape: tiny (15M), 110m, or moe (qwen3moe: 32 experts, 4 active)");
  cmd->add_option("--arch", opts->spec.arch,
                  "llama (with --experts: Mixtral-style), qwen3, qwen3moe or olmoe");
  cmd->add_option(
      "--type", opts->type,
      "matrix type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, "
      "iq4_nl, iq4_xs, mxfp4 (every matrix in it), or one of llama.cpp's mixes: q4_k_m (Q4_K "
      "and Q6_K), q3_k_m (Q3_K with Q4_K, Q5_K and Q6_K), q2_k_mix (its Q2_K file type: Q2_K "
      "with Q3_K, Q4_K and Q6_K)");
  cmd->add_option("--dim", opts->spec.dim, "embedding size");
  cmd->add_option("--layers", opts->spec.num_layers, "transformer blocks");
  cmd->add_option("--heads", opts->spec.num_heads, "attention heads");
  cmd->add_option("--kv-heads", opts->spec.num_kv_heads, "key/value heads");
  cmd->add_option("--ffn", opts->spec.ffn_dim, "feed-forward size");
  cmd->add_option("--head-dim", opts->spec.head_dim, "head size (default dim / heads)");
  cmd->add_option("--experts", opts->spec.num_experts, "routed experts a layer (0: dense)");
  cmd->add_option("--experts-used", opts->spec.num_experts_used, "experts a token");
  cmd->add_option("--expert-ffn", opts->spec.expert_ffn_dim, "an expert's feed-forward size");
  cmd->add_option("--vocab-size", opts->spec.vocab_size, "size of the built-in vocabulary");
  cmd->add_option("--vocab", opts->spec.vocab_path, "GGUF file whose tokenizer to copy");
  cmd->add_option("--context-length", opts->spec.context_length, "context length");
  cmd->add_option("--seed", opts->spec.seed, "weights seed");
  cmd->callback([opts, cmd] {
    auto preset = model::random_model_preset(opts->preset);
    if (!preset) throw CLI::ValidationError("--preset", preset.error().message);
    model::RandomModelSpec spec = *preset;
    // Explicit shape flags override the preset.
    if (cmd->count("--dim")) spec.dim = opts->spec.dim;
    if (cmd->count("--layers")) spec.num_layers = opts->spec.num_layers;
    if (cmd->count("--heads")) spec.num_heads = opts->spec.num_heads;
    // Without --kv-heads, a new head count means plain multi-head attention.
    if (cmd->count("--kv-heads"))
      spec.num_kv_heads = opts->spec.num_kv_heads;
    else if (cmd->count("--heads"))
      spec.num_kv_heads = spec.num_heads;
    if (cmd->count("--ffn")) spec.ffn_dim = opts->spec.ffn_dim;
    if (cmd->count("--arch")) spec.arch = opts->spec.arch;
    if (cmd->count("--head-dim")) spec.head_dim = opts->spec.head_dim;
    if (cmd->count("--experts")) spec.num_experts = opts->spec.num_experts;
    if (cmd->count("--experts-used")) spec.num_experts_used = opts->spec.num_experts_used;
    if (cmd->count("--expert-ffn")) spec.expert_ffn_dim = opts->spec.expert_ffn_dim;
    if (cmd->count("--vocab-size")) spec.vocab_size = opts->spec.vocab_size;
    if (cmd->count("--context-length")) spec.context_length = opts->spec.context_length;
    if (cmd->count("--seed")) spec.seed = opts->spec.seed;
    spec.vocab_path = opts->spec.vocab_path;
    if (const auto mix = kMixes.find(opts->type); mix != kMixes.end()) {
      spec.mix = mix->second;
    } else if (const auto type = kTypes.find(opts->type); type != kTypes.end()) {
      spec.type = type->second;
    } else {
      throw CLI::ValidationError("--type", "unknown type " + opts->type);
    }
    Result<void> written;
    try {
      written = model::write_random_model(spec, opts->out);
    } catch (const std::bad_alloc&) {
      written = make_error(ErrorCode::invalid_argument,
                           "not enough memory to write a model of this shape");
    }
    if (!written) {
      std::fprintf(stderr, "troupe make-model: %s\n", written.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    std::fprintf(stderr, "wrote %s\n", opts->out.c_str());
  });
}

void add_make_lora_command(CLI::App& app) {
  struct Options {
    std::string out, type = "f16";
    model::RandomAdapterSpec spec;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "make-lora", "write a random LoRA adapter (llama.cpp's GGUF layout) for a model file");
  cmd->add_option("--base", opts->spec.base_path, "the base model's GGUF file")->required();
  cmd->add_option("--out,-o", opts->out, "file to write")->required();
  cmd->add_option("--rank,-r", opts->spec.rank, "the adapter's rank")->check(CLI::Range(1, 4096));
  cmd->add_option("--alpha", opts->spec.alpha, "adapter.lora.alpha (s = alpha / rank)");
  cmd->add_option("--targets", opts->spec.targets,
                  "matrices to adapt: attn_q attn_k attn_v attn_output ffn_gate ffn_up "
                  "ffn_down (default: all the base has)");
  cmd->add_option("--type", opts->type,
                  "tensor type: f16 (the usual type of converted adapters) or f32");
  cmd->add_option("--seed", opts->spec.seed, "values seed");
  cmd->add_option("--stddev", opts->spec.stddev, "spread of A's and B's values");
  cmd->callback([opts] {
    if (opts->type != "f32" && opts->type != "f16") {
      throw CLI::ValidationError("--type", "f32 or f16");
    }
    opts->spec.type = opts->type == "f16" ? gguf::TensorType::f16 : gguf::TensorType::f32;
    const auto written = model::write_random_adapter(opts->spec, opts->out);
    if (!written) {
      std::fprintf(stderr, "troupe make-lora: %s\n", written.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    std::fprintf(stderr, "wrote %s\n", opts->out.c_str());
  });
}

}  // namespace troupe::app
