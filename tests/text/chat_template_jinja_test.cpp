// Every chat template under ../shared/chat-templates renders here byte for byte as
// Python's jinja2 renders it (set up as Hugging Face transformers sets it up), over
// conversations with and without a system message, several turns, tool calls and
// tool results, with and without the generation prompt.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/test_support.hpp"
#include "text/jinja/template.hpp"

namespace {

namespace jinja = troupe::text::jinja;
using jinja::Dict;
using jinja::List;
using jinja::Value;

Value object(std::initializer_list<std::pair<std::string, Value>> items) {
  Dict d;
  for (const auto& [k, v] : items) d.set(k, v);
  return d;
}

Value message(const std::string& role, Value content) {
  return object({{"role", role}, {"content", std::move(content)}});
}

Value weather_tool() {
  return object(
      {{"type", "function"},
       {"function", object({{"name", "get_weather"},
                            {"description", "The weather in a city, now"},
                            {"parameters",
                             object({{"type", "object"},
                                     {"properties",
                                      object({{"city", object({{"type", "string"},
                                                               {"description", "Paris, \"Île\""}})},
                                              {"days", object({{"type", "integer"}})}})},
                                     {"required", List{"city"}}})}})}});
}

struct Conversation {
  std::string name;
  List messages;
  bool with_tools = false;
  Dict extra;  // chat_template_kwargs
};

std::vector<Conversation> conversations() {
  const Value tool_call =
      object({{"id", "call12345"},
              {"type", "function"},
              {"function", object({{"name", "get_weather"},
                                   {"arguments", object({{"city", "Paris"}, {"days", 2}})}})}});
  const List tool_turns = {
      message("user", "What's the weather in Paris?"),
      object({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", List{tool_call}}}),
      object({{"role", "tool"},
              {"tool_call_id", "call12345"},
              {"name", "get_weather"},
              {"content", "{\"temperature\": 21.5, \"sky\": \"clear\"}"}}),
  };
  Dict llama_kwargs;
  llama_kwargs.set("date_string", "01 Jan 2025");
  llama_kwargs.set("tools_in_user_message", false);
  return {
      {"a single user turn", {message("user", "Hello!")}, false, {}},
      {"system and user",
       {message("system", "You are terse.\n"), message("user", "  Hi there  ")},
       false,
       {}},
      {"several turns",
       {message("user", "What is 2+2?"), message("assistant", "4"),
        message("user", "And \"3+3\"? Привет 👋\nthanks")},
       false,
       {}},
      {"tools offered to a user turn", {message("user", "Weather in Paris?")}, true, {}},
      {"a tool call and its result", tool_turns, true, {}},
      {"a tool call and its result after a system message",
       [&] {
         List m = {message("system", "Use tools.")};
         m.insert(m.end(), tool_turns.begin(), tool_turns.end());
         return m;
       }(),
       true,
       {}},
      {"chat_template_kwargs", {message("user", "Hello!")}, true, llama_kwargs},
      {"two tool calls in one turn, with content",
       {message("user", "Weather in Paris and Lyon?"),
        object({{"role", "assistant"},
                {"content", "Checking both."},
                {"tool_calls",
                 List{tool_call, object({{"id", "call67890"},
                                         {"type", "function"},
                                         {"function", object({{"name", "get_weather"},
                                                              {"arguments",
                                                               object({{"city", "Lyon"}})}})}})}}}),
        object({{"role", "tool"}, {"tool_call_id", "call12345"}, {"content", "sunny"}}),
        object({{"role", "tool"}, {"tool_call_id", "call67890"}, {"content", "rain"}}),
        message("assistant", "Sunny in Paris, rain in Lyon."), message("user", "Thanks!")},
       true,
       {}},
      {"roles that do not alternate", {message("user", "one"), message("user", "two")}, false, {}},
  };
}

Dict variables(const Conversation& c, bool add_generation_prompt) {
  Dict v = c.extra;
  v.set("messages", c.messages);
  v.set("tools", c.with_tools ? Value(List{weather_tool()}) : Value(nullptr));
  v.set("documents", nullptr);
  v.set("add_generation_prompt", add_generation_prompt);
  v.set("bos_token", "<s>");
  v.set("eos_token", "</s>");
  return v;
}

std::tm fixed_clock() {
  std::tm t{};
  t.tm_year = 2024 - 1900;
  t.tm_mon = 6;
  t.tm_mday = 26;
  t.tm_hour = 12;
  t.tm_wday = 5;
  t.tm_yday = 207;
  return t;
}

struct Case {
  std::string template_path;
  std::string conversation;
  bool add_generation_prompt;
  Dict variables;
};

// Runs render_jinja.py over all cases at once; skips when python3 or jinja2 is absent.
std::filesystem::path render_in_python(const std::vector<Case>& cases) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("troupe_jinja_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  List list;
  for (const auto& c : cases) {
    list.push_back(object({{"template", c.template_path}, {"variables", c.variables}}));
  }
  std::ofstream(dir / "cases.json") << jinja::to_json(list);
  if (!troupe::test::python_has("jinja2")) {
    troupe::test::skip_test(std::string(troupe::test::kPython) +
                            " with jinja2 is absent (Debian: python3-jinja2)");
  }
  const std::string script = std::string(TROUPE_SOURCE_DIR) + "/tests/text/render_jinja.py";
  const std::string command = std::string(troupe::test::kPython) + " '" + script + "' '" +
                              (dir / "cases.json").string() + "' '" + dir.string() + "'";
  REQUIRE(std::system(command.c_str()) == 0);
  return dir;
}

}  // namespace

TEST_CASE("every shared chat template renders every conversation as jinja2 does", "[text][jinja]") {
  const auto template_dir = troupe::test::shared_dir() / "chat-templates";
  if (!std::filesystem::is_directory(template_dir)) {
    troupe::test::skip_test(template_dir.string() + " is absent (../shared holds the templates)");
  }
  std::vector<std::string> templates;
  for (const auto& entry : std::filesystem::directory_iterator(template_dir)) {
    if (entry.path().extension() == ".jinja") templates.push_back(entry.path().string());
  }
  std::sort(templates.begin(), templates.end());
  REQUIRE(templates.size() >= 5);

  std::vector<Case> cases;
  for (const auto& path : templates) {
    for (const auto& c : conversations()) {
      for (const bool prompt : {true, false})
        cases.push_back({path, c.name, prompt, variables(c, prompt)});
    }
  }
  const auto out = render_in_python(cases);

  jinja::RenderOptions options;
  options.now = fixed_clock;
  int num_rendered = 0, num_raised = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    INFO(std::filesystem::path(c.template_path).filename().string()
         << ": " << c.conversation << (c.add_generation_prompt ? ", with" : ", without")
         << " the generation prompt");
    const auto parsed = jinja::Template::parse(troupe::test::read_text(c.template_path));
    REQUIRE(parsed.has_value());
    const auto rendered = parsed->render(c.variables, options);
    const auto base = out / std::to_string(i);
    if (std::filesystem::exists(base.string() + ".txt")) {
      INFO((rendered ? std::string() : rendered.error().message));
      REQUIRE(rendered.has_value());
      CHECK(*rendered == troupe::test::read_text(base.string() + ".txt"));
      ++num_rendered;
    } else if (std::filesystem::exists(base.string() + ".raised")) {
      REQUIRE_FALSE(rendered.has_value());
      CHECK(rendered.error().message == troupe::test::read_text(base.string() + ".raised"));
      ++num_raised;
    } else {
      INFO("jinja2: " << troupe::test::read_text(base.string() + ".error"));
      CHECK_FALSE(rendered.has_value());
    }
  }
  // Most cases render; the ones that raise include Gemma's refusal of a system message.
  CHECK(num_rendered > static_cast<int>(cases.size()) / 2);
  CHECK(num_raised > 0);
  std::filesystem::remove_all(out);
}

TEST_CASE("Gemma's template refuses a system message with its own words, as jinja2 does",
          "[text][jinja]") {
  const auto path = troupe::test::shared_file("chat-templates/google-gemma-2-2b-it.jinja");
  const Conversation c = conversations()[1];  // system and user
  REQUIRE(c.messages[0].as_dict().find("role")->as_string() == "system");
  const auto out = render_in_python({{path, c.name, true, variables(c, true)}});
  REQUIRE(troupe::test::read_text((out / "0.raised").string()) == "System role not supported");
  const auto parsed = jinja::Template::parse(troupe::test::read_text(path));
  REQUIRE(parsed.has_value());
  const auto rendered = parsed->render(variables(c, true));
  REQUIRE_FALSE(rendered.has_value());
  CHECK(rendered.error().message == "System role not supported");
  std::filesystem::remove_all(out);
}
