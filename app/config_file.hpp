// `--config FILE`, as vLLM's: a YAML or JSON file whose keys are a command's flag names
// (`max-model-len: 4096`, or `max_model_len`), each read as if given on the command line;
// a flag given on the command line wins over the file. The YAML read is the flat subset
// such files use: `key: value`, quoted or bare scalars, `[a, b]` and `- item` lists,
// comments. Anything nested is refused, naming its line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/result.hpp"

namespace CLI {
class App;
}

namespace troupe::app {

struct ConfigEntry {
  std::string key;                  // as written, without leading dashes
  std::vector<std::string> values;  // one for a scalar; booleans as "true" / "false"
  bool is_list = false;
  int line = 0;  // where it was (1-based; 0 for JSON)
};

// YAML (the flat subset above) or JSON (an object of scalars and lists), told apart by
// the first character that is not blank or a comment.
Result<std::vector<ConfigEntry>> parse_config_text(std::string_view text);
// A config file holds flag values: a few kilobytes; past this bound it is refused.
inline constexpr std::size_t kMostConfigFileBytes = std::size_t{1} << 20;
Result<std::vector<ConfigEntry>> read_config_file(const std::string& path);

// The bytes of the file at `path` (`what` names it in errors: "config file"), at most
// `most` of them. Anything but a regular file is refused without waiting on it: opening
// a FIFO for reading would wait for a writer forever, a directory reads as nothing, and
// a device may never end.
Result<std::string> read_small_file(const std::string& path, const std::string& what,
                                    std::size_t most);

// The command line (without the program's name) with `--config FILE` replaced by the
// file's flags, put after the subcommand's own name for those not given already.
// Errors name the file, the line and the flag: an unknown flag, a list for a flag that
// takes one value, a value for a switch other than true or false.
Result<std::vector<std::string>> expand_config(const CLI::App& app, std::vector<std::string> args);

// Adds `--config FILE` to the help of every subcommand that takes options (expand_config
// does the reading, before CLI11 parses).
void add_config_option(CLI::App& app);

}  // namespace troupe::app
