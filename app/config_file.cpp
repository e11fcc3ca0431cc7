#include "app/config_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/json.hpp>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <sstream>

namespace troupe::app {

namespace {

namespace json = boost::json;

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\r");
  return text.substr(first, last - first + 1);
}

// The line without a comment: a '#' outside quotes that starts the line or follows a blank.
std::string_view strip_comment(std::string_view line) {
  char quote = 0;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
      return line.substr(0, i);
    }
  }
  return line;
}

Error bad(int line, const std::string& message) {
  return Error{ErrorCode::invalid_argument, "line " + std::to_string(line) + ": " + message};
}

// A YAML scalar: quotes taken off ('' inside single quotes is one quote; the usual
// escapes inside double quotes), a bare word as written.
Result<std::string> scalar(std::string_view text, int line) {
  text = trim(text);
  if (text.empty()) return std::string();
  const char q = text.front();
  if (q != '"' && q != '\'') {
    if (q == '{' || q == '&' || q == '*' || q == '|' || q == '>' || q == '!') {
      return tl::unexpected(bad(line, "only plain values, quoted strings and lists are read"));
    }
    return std::string(text);
  }
  if (text.size() < 2 || text.back() != q) {
    return tl::unexpected(bad(line, "a quoted value without its closing quote"));
  }
  const auto inner = text.substr(1, text.size() - 2);
  std::string out;
  for (std::size_t i = 0; i < inner.size(); ++i) {
    const char c = inner[i];
    if (q == '\'' && c == '\'' && i + 1 < inner.size() && inner[i + 1] == '\'') {
      out += '\'';
      ++i;
    } else if (q == '"' && c == '\\' && i + 1 < inner.size()) {
      const char e = inner[++i];
      out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
    } else {
      out += c;
    }
  }
  return out;
}

// `[a, "b, c", d]`: commas inside quotes stay.
Result<std::vector<std::string>> flow_list(std::string_view text, int line) {
  const auto inner = trim(text.substr(1, text.size() - 2));
  std::vector<std::string> items;
  if (inner.empty()) return items;
  char quote = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= inner.size(); ++i) {
    const char c = i < inner.size() ? inner[i] : ',';
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '{') {
      return tl::unexpected(bad(line, "a list inside a list is not a flag value"));
    } else if (c == ',') {
      auto item = scalar(inner.substr(start, i - start), line);
      if (!item) return tl::unexpected(item.error());
      items.push_back(std::move(*item));
      start = i + 1;
    }
  }
  return items;
}

Result<std::vector<ConfigEntry>> parse_yaml(std::string_view text) {
  std::vector<ConfigEntry> entries;
  std::istringstream lines{std::string(text)};
  std::string raw;
  int number = 0;
  while (std::getline(lines, raw)) {
    ++number;
    const std::string_view line = strip_comment(raw);
    if (trim(line).empty()) continue;
    if (trim(line) == "---" && entries.empty()) continue;  // a document's start
    const bool indented = line.front() == ' ' || line.front() == '\t';
    const auto body = trim(line);
    if (body.starts_with("- ") || body == "-") {
      // An item of the list the last key opened.
      if (entries.empty() || !entries.back().is_list) {
        return tl::unexpected(bad(number, "a list item with no key above it"));
      }
      auto item = scalar(body.substr(1), number);
      if (!item) return tl::unexpected(item.error());
      entries.back().values.push_back(std::move(*item));
      continue;
    }
    if (indented) {
      return tl::unexpected(
          bad(number, "nested keys are not flags (keys are flag names, at the line's start)"));
    }
    const auto colon = body.find(':');
    if (colon == std::string_view::npos || colon == 0) {
      return tl::unexpected(bad(number, "expected `flag-name: value`"));
    }
    ConfigEntry entry;
    entry.key = std::string(trim(body.substr(0, colon)));
    entry.line = number;
    const auto value = trim(body.substr(colon + 1));
    if (value.empty()) {
      entry.is_list = true;  // a block list follows (or the value is empty)
    } else if (value.front() == '[') {
      if (value.back() != ']') return tl::unexpected(bad(number, "a list without its closing ]"));
      auto items = flow_list(value, number);
      if (!items) return tl::unexpected(items.error());
      entry.values = std::move(*items);
      entry.is_list = true;
    } else {
      auto one = scalar(value, number);
      if (!one) return tl::unexpected(one.error());
      entry.values.push_back(std::move(*one));
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

Result<std::string> json_scalar(const json::value& v, const std::string& key) {
  if (v.is_string()) return std::string(v.as_string());
  if (v.is_bool()) return std::string(v.as_bool() ? "true" : "false");
  if (v.is_int64() || v.is_uint64()) return json::serialize(v);
  if (v.is_double()) {  // the shortest form that reads back: 0.9, not 9E-1
    char digits[32];
    const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, v.as_double());
    return std::string(digits, ec == std::errc() ? end : digits);
  }
  return make_error(ErrorCode::invalid_argument,
                    "\"" + key +
                        "\": only strings, numbers, booleans and lists of them are flag "
                        "values");
}

Result<std::vector<ConfigEntry>> parse_json(std::string_view text) {
  boost::system::error_code ec;
  const json::value root = json::parse(text, ec);
  if (ec) return make_error(ErrorCode::invalid_argument, "not valid JSON: " + ec.message());
  if (!root.is_object()) {
    return make_error(ErrorCode::invalid_argument, "the JSON must be one object of flag values");
  }
  std::vector<ConfigEntry> entries;
  for (const auto& [key, value] : root.as_object()) {
    ConfigEntry entry;
    entry.key = std::string(key);
    if (value.is_array()) {
      entry.is_list = true;
      for (const auto& item : value.as_array()) {
        auto one = json_scalar(item, entry.key);
        if (!one) return tl::unexpected(one.error());
        entry.values.push_back(std::move(*one));
      }
    } else if (!value.is_null()) {
      auto one = json_scalar(value, entry.key);
      if (!one) return tl::unexpected(one.error());
      entry.values.push_back(std::move(*one));
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

// `max_model_len` and `--max-model-len` name the flag --max-model-len.
std::string flag_name(std::string key) {
  while (!key.empty() && key.front() == '-') key.erase(key.begin());
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

// A switch's other half: --no-enable-prefix-caching for --enable-prefix-caching, and back.
std::string opposite(const std::string& name) {
  return name.starts_with("no-") ? name.substr(3) : "no-" + name;
}

bool given(const CLI::Option& option, const std::vector<std::string>& args) {
  auto named = [&args](const std::string& name) {
    return std::any_of(args.begin(), args.end(), [&name](const std::string& arg) {
      return arg == name || arg.starts_with(name + "=");
    });
  };
  for (const auto& l : option.get_lnames()) {
    if (named("--" + l)) return true;
  }
  for (const auto& s : option.get_snames()) {
    if (named("-" + s)) return true;
  }
  return false;
}

std::optional<bool> truth(std::string value) {
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (value == "true" || value == "yes" || value == "on" || value == "1") return true;
  if (value == "false" || value == "no" || value == "off" || value == "0") return false;
  return std::nullopt;
}

}  // namespace

Result<std::vector<ConfigEntry>> parse_config_text(std::string_view text) {
  // The first character that is neither blank nor in a comment tells JSON from YAML.
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '#') {
      i = text.find('\n', i);
      if (i == std::string_view::npos) break;
    } else if (c != ' ' && c != '\t' && c != '\r' && c != '\n') {
      return c == '{' ? parse_json(text) : parse_yaml(text);
    }
  }
  return std::vector<ConfigEntry>{};
}

Result<std::string> read_small_file(const std::string& path, const std::string& what,
                                    std::size_t most) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return make_error(ErrorCode::io,
                      "cannot read the " + what + " " + path + ": " + std::strerror(errno));
  }
  auto refuse = [fd](ErrorCode code, const std::string& message) {
    ::close(fd);
    return make_error(code, message);
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return refuse(ErrorCode::io,
                  "cannot read the " + what + " " + path + ": " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    return refuse(ErrorCode::invalid_argument,
                  "the " + what + " " + path + " is a directory, not a file");
  }
  if (!S_ISREG(st.st_mode)) {
    return refuse(ErrorCode::invalid_argument, "the " + what + " " + path +
                                                   " is not a regular file (a FIFO, a socket "
                                                   "or a device)");
  }
  if (static_cast<std::uint64_t>(st.st_size) > most) {
    return refuse(ErrorCode::invalid_argument,
                  "the " + what + " " + path + " is " + std::to_string(st.st_size) +
                      " bytes, more than the " + std::to_string(most) + " it may hold");
  }
  // Read to its end, at most one byte past the bound (a file that grew meanwhile).
  std::string text;
  char buffer[65536];
  while (text.size() <= most) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return refuse(ErrorCode::io,
                    "cannot read the " + what + " " + path + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (text.size() > most) {
    return make_error(ErrorCode::invalid_argument, "the " + what + " " + path +
                                                       " is more than the " + std::to_string(most) +
                                                       " bytes it may hold");
  }
  return text;
}

Result<std::vector<ConfigEntry>> read_config_file(const std::string& path) {
  auto text = read_small_file(path, "config file", kMostConfigFileBytes);
  if (!text) return tl::unexpected(text.error());
  auto entries = parse_config_text(*text);
  if (!entries) {
    return make_error(entries.error().code, "config file " + path + ": " + entries.error().message);
  }
  return entries;
}

Result<std::vector<std::string>> expand_config(const CLI::App& app, std::vector<std::string> args) {
  // The subcommand the flags belong to: the longest run of subcommand names at the start.
  const CLI::App* command = &app;
  std::size_t after = 0;
  while (after < args.size()) {
    const auto found = command->get_subcommands(
        [&](const CLI::App* sub) { return sub->get_name() == args[after]; });
    if (found.empty()) break;
    command = found.front();
    ++after;
  }
  std::string path;
  std::vector<std::string> rest;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (i >= after && args[i] == "--config") {
      if (i + 1 >= args.size())
        return make_error(ErrorCode::invalid_argument, "--config needs a file");
      path = args[++i];
    } else if (i >= after && args[i].starts_with("--config=")) {
      path = args[i].substr(9);
    } else {
      rest.push_back(args[i]);
    }
  }
  if (path.empty()) return rest;
  auto entries = read_config_file(path);
  if (!entries) return tl::unexpected(entries.error());
  std::vector<std::string> added;
  for (const ConfigEntry& entry : *entries) {
    const std::string name = flag_name(entry.key);
    const std::string where = "config file " + path +
                              (entry.line > 0 ? " line " + std::to_string(entry.line) : "") + ": ";
    const CLI::Option* option = command->get_option_no_throw("--" + name);
    if (option == nullptr || name == "config" || name == "help") {
      return make_error(ErrorCode::invalid_argument, where + "`" + entry.key +
                                                         "` is not a flag of `troupe " +
                                                         command->get_name() + "` (see --help)");
    }
    // The command line wins: the flag itself, or for a switch its other half.
    const CLI::Option* other = command->get_option_no_throw("--" + opposite(name));
    const bool is_switch = option->get_expected_min() == 0;
    if (given(*option, rest) || (is_switch && other != nullptr && given(*other, rest))) continue;
    if (is_switch) {
      const auto on = entry.values.size() == 1 ? truth(entry.values.front()) : std::nullopt;
      if (!on) {
        return make_error(ErrorCode::invalid_argument,
                          where + "--" + name + " is a switch: true or false");
      }
      // `enable-prefix-caching: false` means its other half, where there is one.
      if (*on) {
        added.push_back("--" + name);
      } else if (other != nullptr && other->get_expected_min() == 0) {
        added.push_back("--" + opposite(name));
      }
      continue;
    }
    if (entry.is_list && option->get_items_expected_max() <= 1) {
      return make_error(ErrorCode::invalid_argument, where + "--" + name + " takes one value");
    }
    if (entry.values.empty()) {
      return make_error(ErrorCode::invalid_argument, where + "--" + name + " has no value");
    }
    for (const auto& value : entry.values) {
      added.push_back("--" + name);
      added.push_back(value);
    }
  }
  rest.insert(rest.begin() + static_cast<std::ptrdiff_t>(after), added.begin(), added.end());
  return rest;
}

void add_config_option(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (!sub->get_subcommands([](CLI::App*) { return true; }).empty()) {
      add_config_option(*sub);
      continue;
    }
    sub->add_option("--config",
                    "a YAML or JSON file of flag values (keys are flag names); "
                    "flags on the command line win")
        ->type_name("FILE");
  }
}

}  // namespace troupe::app
