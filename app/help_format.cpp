// `--help` as a person reads it: each flag's type once (CLI11 writes a flag's type and
// then each check's own, "INT:INT in [0 - 65535]"), its range as one text, and its default
// once, at the end of its description, as vLLM's help writes it ("(default: 8000)").
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "app/commands.hpp"

namespace troupe::app {

namespace {

bool is_type_word(const std::string& word) {
  return word == "INT" || word == "UINT" || word == "FLOAT" || word == "TEXT" || word == "NUMBER";
}

// "INT:INT in [0 - 65535]" -> "INT in [0, 65535]"; "N|auto:N|auto" -> "N|auto";
// "TEXT:DIR" -> "DIR"; "FLOAT:in [0.01, 1]" -> "FLOAT in [0.01, 1]"; "INT:POSITIVE" ->
// "INT > 0".
std::string readable_type(const std::string& full) {
  std::vector<std::string> parts;
  std::stringstream in(full);
  for (std::string part; std::getline(in, part, ':');) {
    if (!part.empty()) parts.push_back(part);
  }
  if (parts.empty()) return {};
  std::string type = parts.front();
  std::string checks;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    std::string check = parts[i];
    if (check == type) continue;
    // A check that names the type again ("INT in [...]") says it once.
    const auto space = check.find(' ');
    if (space != std::string::npos && is_type_word(check.substr(0, space))) {
      check = check.substr(space + 1);
    }
    // CLI11's sign checks, in a person's words.
    if (check == "POSITIVE") check = "> 0";
    if (check == "NONNEGATIVE") check = ">= 0";
    // A check that is a kind of text ("DIR", "FILE") is the type.
    if (type == "TEXT" && check.find(' ') == std::string::npos) {
      type = check;
      continue;
    }
    checks += " " + check;
  }
  // CLI11's ranges read "[0 - 65535]"; number_in's "[0.01, 1]": one way.
  std::string text = type + checks;
  for (auto at = text.find(" - "); at != std::string::npos; at = text.find(" - ", at)) {
    text.replace(at, 3, ", ");
  }
  return text;
}

class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string out;
    if (!opt->get_option_text().empty()) return " " + opt->get_option_text();
    if (opt->get_type_size() != 0) {
      const std::string type = readable_type(opt->get_type_name());
      if (!type.empty()) out += " " + type;
      if (opt->get_expected_max() == CLI::detail::expected_max_vector_size) out += " ...";
      if (opt->get_required()) out += " REQUIRED";
    }
    if (!opt->get_envname().empty()) out += " (env " + opt->get_envname() + ")";
    for (const CLI::Option* other : opt->get_excludes()) {
      out += " (not with " + other->get_name() + ")";
    }
    return out;
  }

  // An option that is also a positional (serve's model) is described in full there; its
  // flag's line in its group says only that it is the same.
  std::string make_option(const CLI::Option* opt, bool is_positional) const override {
    std::stringstream out;
    std::string desc = make_option_desc(opt);
    if (!is_positional && opt->get_positional()) {
      desc = "the positional " + opt->get_name(true) + ", as a flag";
    }
    CLI::detail::format_help(out, make_option_name(opt, is_positional) + make_option_opts(opt),
                             desc, column_width_);
    return out.str();
  }

  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string desc = opt->get_description();
    // A switch's default is off; a flag without a value of its own has none to show; a
    // description that says its default in words ("(default: every one it has)") has it
    // once already (the value captured, -1 or 0, is its sentinel).
    if (opt->get_type_size() != 0 && !opt->get_default_str().empty() &&
        desc.find("(default:") == std::string::npos) {
      std::string shown = opt->get_default_str();
      if (shown.size() > 2 && shown.front() == '[' && shown.back() == ']') {
        shown = shown.substr(1, shown.size() - 2);  // a list's: "[*]" reads "*"
      }
      desc += " (default: " + shown + ")";
    }
    return desc;
  }
};

}  // namespace

namespace {

// "KV cache", "kv-cache" and "KV_Cache" are one name.
std::string folded(const std::string& name) {
  std::string out;
  for (const char c : name) {
    if (c == ' ' || c == '-' || c == '_') continue;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// The command's sections, in the order their first flag appears.
std::vector<std::string> groups_of(const CLI::App& command) {
  std::vector<std::string> groups;
  for (const CLI::Option* opt : command.get_options()) {
    const std::string& group = opt->get_group();
    if (group.empty() || (opt->get_positional() && opt->get_lnames().empty())) continue;
    if (std::find(groups.begin(), groups.end(), group) == groups.end()) groups.push_back(group);
  }
  return groups;
}

}  // namespace

std::string group_help(const CLI::App& command, const std::string& which) {
  const auto groups = groups_of(command);
  if (which == "listgroup") {
    std::string out;
    for (const auto& group : groups) out += group + "\n";
    return out;
  }
  const auto formatter = std::dynamic_pointer_cast<CLI::Formatter>(command.get_formatter());
  if (!formatter) return {};
  // A section by its whole name, or by the start of one alone ("vllm").
  std::string group;
  for (const auto& g : groups) {
    if (folded(g) == folded(which)) group = g;
  }
  if (group.empty() && !which.empty()) {
    for (const auto& g : groups) {
      if (!folded(g).starts_with(folded(which))) continue;
      if (!group.empty()) return {};  // more than one: say which there are
      group = g;
    }
  }
  std::string out;
  for (const CLI::Option* opt : command.get_options()) {
    const bool named = which.starts_with("--") && opt->check_lname(which.substr(2));
    if (named || (!which.starts_with("--") && !group.empty() && opt->get_group() == group)) {
      if (out.empty() && !named) out = opt->get_group() + ":\n";
      out += formatter->make_option(opt, false);
    }
  }
  return out;
}

bool answer_group_help(const CLI::App& app, const std::vector<std::string>& args, int& status) {
  const CLI::App* command = &app;
  for (const std::string& arg : args) {
    if (arg.starts_with("--help=")) {
      const std::string which = arg.substr(7);
      const std::string text = group_help(*command, which);
      if (!text.empty()) {
        std::fputs(text.c_str(), stdout);
        status = 0;
        return true;
      }
      std::string known;
      for (const auto& group : groups_of(*command)) known += (known.empty() ? "" : ", ") + group;
      std::fprintf(stderr,
                   "--help=%s: no such section or flag; the sections are %s (or --help=listgroup, "
                   "--help=--FLAG)\n",
                   which.c_str(), known.c_str());
      status = 2;
      return true;
    }
    const auto named =
        command->get_subcommands([&arg](const CLI::App* sub) { return sub->check_name(arg); });
    if (!named.empty()) command = named.front();
  }
  return false;
}

std::shared_ptr<CLI::FormatterBase> make_help_formatter() {
  auto formatter = std::make_shared<HelpFormatter>();
  formatter->column_width(34);
  return formatter;
}

}  // namespace troupe::app
