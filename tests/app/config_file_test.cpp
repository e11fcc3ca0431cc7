// --config FILE: YAML and JSON read into flags, the command line winning, and clear
// errors for what is not a flag value.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>

#include "app/config_file.hpp"

using namespace troupe::app;

namespace {

struct Fixture {
  CLI::App app{"test"};
  CLI::App* serve = app.add_subcommand("serve", "");
  int port = 8000;
  std::string host = "127.0.0.1";
  double share = 0.5;
  bool no_prefix = false;
  bool prefix = false;
  std::vector<std::string> origins;
  Fixture() {
    serve->add_option("--port", port, "");
    serve->add_option("--host", host, "");
    serve->add_flag("--no-enable-prefix-caching", no_prefix, "");
    serve->add_flag("--enable-prefix-caching", prefix, "");
    serve->add_option("--share", share, "");
    serve->add_option("--allowed-origins", origins, "");
    add_config_option(app);
  }
  std::filesystem::path write(const std::string& name, const std::string& text) {
    const auto path = std::filesystem::temp_directory_path() / name;
    std::ofstream(path) << text;
    return path;
  }
  std::vector<std::string> expand(std::vector<std::string> args) {
    auto out = expand_config(app, std::move(args));
    REQUIRE(out);
    return *out;
  }
  std::string error(std::vector<std::string> args) {
    auto out = expand_config(app, std::move(args));
    REQUIRE_FALSE(out);
    return out.error().message;
  }
};

using Args = std::vector<std::string>;

}  // namespace

TEST_CASE("a YAML file's flags join the command line, which wins", "[app][config]") {
  Fixture f;
  const auto path = f.write("troupe-config-test.yaml",
                            "# a comment\n"
                            "port: 9000\n"
                            "host: \"0.0.0.0\"  # trailing comment\n"
                            "no_enable_prefix_caching: true\n"
                            "allowed-origins:\n"
                            "  - https://a.example\n"
                            "  - 'https://b.example'\n");
  CHECK(f.expand({"serve", "--config", path.string()}) ==
        Args{"serve", "--port", "9000", "--host", "0.0.0.0", "--no-enable-prefix-caching",
             "--allowed-origins", "https://a.example", "--allowed-origins", "https://b.example"});
  // Given on the command line (either spelling): the file's value is left out.
  CHECK(f.expand({"serve", "--port=1", "--config=" + path.string(), "--host", "h"}) ==
        Args{"serve", "--no-enable-prefix-caching", "--allowed-origins", "https://a.example",
             "--allowed-origins", "https://b.example", "--port=1", "--host", "h"});
  // And CLI11 reads the result as a command line.
  auto args = f.expand({"serve", "--config", path.string(), "--port", "7"});
  std::reverse(args.begin(), args.end());
  f.app.parse(args);
  CHECK(f.port == 7);
  CHECK(f.host == "0.0.0.0");
  CHECK(f.no_prefix);
  CHECK(f.origins == Args{"https://a.example", "https://b.example"});
  std::filesystem::remove(path);
}

TEST_CASE("a JSON file is read too, lists and switches included", "[app][config]") {
  Fixture f;
  const auto path = f.write("troupe-config-test.json",
                            R"({"port": 9001, "allowed_origins": ["https://a.example"],
                                "no-enable-prefix-caching": false})");
  CHECK(f.expand({"serve", "--config", path.string()}) ==
        Args{"serve", "--port", "9001", "--allowed-origins", "https://a.example",
             "--enable-prefix-caching"});
  std::filesystem::remove(path);
}

TEST_CASE("what is not a flag value is refused, naming the file, line and flag", "[app][config]") {
  Fixture f;
  auto refused = [&f](const std::string& text) {
    const auto path = f.write("troupe-config-bad.yaml", text);
    const std::string message = f.error({"serve", "--config", path.string()});
    std::filesystem::remove(path);
    return message;
  };
  CHECK_THAT(
      refused("port: 1\nmodell: x\n"),
      Catch::Contains("line 2") && Catch::Contains("`modell` is not a flag of `troupe serve`"));
  CHECK_THAT(refused("port:\n  nested: 1\n"), Catch::Contains("line 2: nested keys"));
  CHECK_THAT(refused("port: [1, 2]\n"), Catch::Contains("--port takes one value"));
  CHECK_THAT(refused("no-enable-prefix-caching: maybe\n"), Catch::Contains("is a switch"));
  CHECK_THAT(refused("host: \"open\n"), Catch::Contains("closing quote"));
  CHECK_THAT(refused("{\"port\": {\"a\": 1}}"), Catch::Contains("only strings, numbers"));
  CHECK_THAT(refused("{\"port\": "), Catch::Contains("not valid JSON"));
  CHECK_THAT(f.error({"serve", "--config", "/nonexistent/troupe.yaml"}),
             Catch::Contains("cannot read the config file /nonexistent/troupe.yaml"));
  CHECK_THAT(f.error({"serve", "--config"}), Catch::Contains("--config needs a file"));
}

TEST_CASE("a switch's other half counts: false means it, and the command line's wins",
          "[app][config]") {
  Fixture f;
  const auto off = f.write("troupe-config-off.yaml", "enable_prefix_caching: false\n");
  CHECK(f.expand({"serve", "--config", off.string()}) ==
        Args{"serve", "--no-enable-prefix-caching"});
  CHECK(f.expand({"serve", "--config", off.string(), "--enable-prefix-caching"}) ==
        Args{"serve", "--enable-prefix-caching"});
  const auto on = f.write("troupe-config-on.yaml", "no-enable-prefix-caching: true\n");
  CHECK(f.expand({"serve", "--config", on.string(), "--enable-prefix-caching"}) ==
        Args{"serve", "--enable-prefix-caching"});
  std::filesystem::remove(off);
  std::filesystem::remove(on);
}

TEST_CASE("JSON numbers reach the flags as written", "[app][config]") {
  Fixture f;
  const auto path = f.write("troupe-config-numbers.json", R"({"share": 0.9, "port": 10.0})");
  CHECK(f.expand({"serve", "--config", path.string()}) ==
        Args{"serve", "--share", "0.9", "--port", "10"});
  std::filesystem::remove(path);
}

TEST_CASE("without --config the command line is left as it is", "[app][config]") {
  Fixture f;
  CHECK(f.expand({"serve", "--port", "1"}) == Args{"serve", "--port", "1"});
  CHECK(parse_config_text("# nothing but a comment\n").value().empty());
}

TEST_CASE("a FIFO, a directory or a device is refused as a config file, at once", "[app][config]") {
  Fixture f;
  const auto dir =
      std::filesystem::temp_directory_path() / ("troupe-config-dir-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  SECTION("a directory (read as a file, it is empty: no flags, said nowhere)") {
    CHECK_THAT(f.error({"serve", "--config", dir.string()}),
               Catch::Contains("the config file " + dir.string() + " is a directory, not a file"));
  }
  SECTION("a device") {
    CHECK_THAT(f.error({"serve", "--config", "/dev/null"}),
               Catch::Contains("the config file /dev/null is not a regular file"));
  }
  SECTION("a FIFO") {
    const auto fifo = dir / "fifo.yaml";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    // Opening a FIFO for reading waits for a writer. The read runs aside; if it has not
    // answered in 10 s a writer comes (and goes at once) so that it ends, and the test fails.
    auto read = std::async(std::launch::async, [&f, &fifo] {
      return expand_config(f.app, {"serve", "--config", fifo.string()});
    });
    const bool answered = read.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    if (!answered) {
      const int writer = ::open(fifo.c_str(), O_WRONLY);
      if (writer >= 0) ::close(writer);
    }
    CHECK(answered);
    const auto expanded = read.get();
    std::filesystem::remove_all(dir);
    REQUIRE_FALSE(expanded.has_value());
    CHECK_THAT(expanded.error().message,
               Catch::Contains("the config file " + fifo.string() + " is not a regular file"));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a config file is at most 1 MiB", "[app][config]") {
  Fixture f;
  // A comment and one flag, past the bound by a byte: a file that size is no config.
  std::string text = "port: 1\n#";
  text.resize(kMostConfigFileBytes + 1, 'x');
  const auto big = f.write("troupe-config-big.yaml", text);
  CHECK_THAT(f.error({"serve", "--config", big.string()}),
             Catch::Contains("is 1048577 bytes, more than the 1048576 it may hold"));
  text.resize(kMostConfigFileBytes);
  const auto largest = f.write("troupe-config-largest.yaml", text);
  CHECK(f.expand({"serve", "--config", largest.string()}) == Args{"serve", "--port", "1"});
  std::filesystem::remove(big);
  std::filesystem::remove(largest);
}
