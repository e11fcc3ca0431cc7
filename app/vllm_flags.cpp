// vLLM's `vllm serve` flags that mean nothing here, accepted so that a vLLM launch line
// starts: each one given is named at start-up with why it has no effect (never silently).
// The flags vLLM has that troupe implements are the serve command's own (serve_command.cpp).
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "monitoring/log.hpp"

namespace troupe::app {

namespace {

struct VllmFlag {
  const char* names;                // CLI11's: "--quantization,-q"
  bool takes_value;                 // false: a switch
  std::vector<std::string> one_of;  // the values vLLM accepts, where it has a list
  const char* why;                  // what is done here instead
};

const std::vector<VllmFlag>& vllm_flags() {
  static const std::vector<VllmFlag> kFlags = {
      {"--enable-auto-tool-choice",
       false,
       {},
       "tool calls are read whenever a request brings tools (tool_choice auto is always on)"},
      {"--disable-log-requests",
       false,
       {},
       "no request's contents are logged, only its access line (--disable-access-log)"},
      {"--enable-log-requests",
       false,
       {},
       "no request's contents are logged, only its access line (--disable-access-log)"},
      {"--max-log-len", true, {}, "no request's contents are logged"},
      {"--enable-chunked-prefill",
       false,
       {},
       "a long prompt is always prefilled in chunks of the token budget "
       "(--max-num-batched-tokens)"},
      {"--generation-config",
       true,
       {},
       "a GGUF model carries no generation_config.json: a request's sampling defaults are "
       "vLLM's own (as --generation-config vllm)"},
      {"--dtype",
       true,
       {"auto", "half", "float16", "bfloat16", "float", "float32"},
       "the weights keep their GGUF type, and the CPU computes in f32 (the KV cache: "
       "--kv-cache-dtype)"},
      {"--quantization,-q", true, {}, "the weights keep their GGUF type"},
      {"--load-format", true, {}, "the model is read as a GGUF file"},
      {"--tokenizer", true, {}, "the tokenizer is the GGUF file's own"},
      {"--tokenizer-mode", true, {}, "the tokenizer is the GGUF file's own"},
      {"--trust-remote-code", false, {}, "a GGUF model runs no code of its own"},
      {"--revision", true, {}, "the model is a local GGUF file"},
      {"--download-dir", true, {}, "the model is a local GGUF file: nothing is downloaded"},
      {"--enable-request-id-headers",
       false,
       {},
       "a response always carries its request's X-Request-Id (the client's, or its own)"},
      {"--uvicorn-log-level",
       true,
       {"debug", "info", "warning", "error", "critical", "trace"},
       "the HTTP server logs at --log-level; its access lines go with --disable-access-log"},
      {"--enable-ssl-refresh",
       false,
       {},
       "the TLS key and certificates are read once, at start-up: restart to take renewed ones"},
      {"--disable-frontend-multiprocessing",
       false,
       {},
       "the HTTP server runs in the engine's process"},
      {"--swap-space", true, {}, "a preempted request is recomputed, not swapped to the CPU"},
      {"--disable-custom-all-reduce",
       false,
       {},
       "tensor-parallel ranks all-reduce over Gloo (on the CPU)"},
      {"--distributed-executor-backend",
       true,
       {},
       "replicas and ranks are actors (--cluster-port for other machines)"},
  };
  return kFlags;
}

constexpr const char* kGroup = "vLLM's flags without effect here (each named at start-up)";

}  // namespace

void add_vllm_flags(CLI::App* cmd) {
  for (const VllmFlag& flag : vllm_flags()) {
    const std::string help = std::string("no effect: ") + flag.why;
    CLI::Option* option = nullptr;
    if (flag.takes_value) {
      option = cmd->add_option(flag.names, help)->type_name("VALUE");
      if (!flag.one_of.empty()) one_of(option, flag.one_of, /*ignore_case=*/true);
    } else {
      option = cmd->add_flag(flag.names, help);
    }
    option->group(kGroup);
  }
}

void log_vllm_flag_notices(const CLI::App* cmd) {
  for (const VllmFlag& flag : vllm_flags()) {
    const CLI::Option* option = cmd->get_option_no_throw(
        std::string(flag.names).substr(0, std::string(flag.names).find(',')));
    if (option == nullptr || option->count() == 0) continue;
    std::string given = option->get_name();
    if (flag.takes_value && !option->results().empty()) given += " " + option->results().back();
    monitoring::log_warning(given + " has no effect here: " + flag.why);
  }
}

}  // namespace troupe::app
