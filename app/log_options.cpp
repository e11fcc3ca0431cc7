#include <CLI/CLI.hpp>

#include "app/commands.hpp"
#include "monitoring/log.hpp"

namespace troupe::app {

void add_log_options(CLI::App* cmd, LogFlags& flags) {
  one_of(cmd->add_option("--log-level", flags.level, "least severe log line written"),
         {"debug", "info", "warning", "error", "off"}, /*ignore_case=*/true);
  one_of(cmd->add_option("--log-format", flags.format,
                         "text (one line a person reads) or json (one object per line, for a "
                         "collector)"),
         {"text", "json"});
}

void apply_log_options(const LogFlags& flags) {
  monitoring::configure_logging(*monitoring::parse_log_level(flags.level),
                                *monitoring::parse_log_format(flags.format));
}

}  // namespace troupe::app
