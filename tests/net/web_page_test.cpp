// The built-in page (net/web_assets.hpp): its files served from the binary at GET / and
// GET /<name> without the API key, with a policy that keeps the page to its own files and
// this server; from a directory with --web-dir; and nothing outside it.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>

#include "net/http_routes.hpp"
#include "net/http_server.hpp"
#include "net/web_assets.hpp"

using namespace troupe::net;

namespace {

std::string header(const Response& r, std::string_view name) {
  const auto it = r.find(name);
  return it == r.end() ? "<none>" : std::string(it->value());
}

Response get(const RouteContext& context, std::string target, http::verb method = http::verb::get) {
  Request request{method, target, 11};
  return route(request, context);
}

const WebAsset* embedded(std::string_view name) {
  for (const WebAsset& asset : web_assets()) {
    if (asset.name == name) return &asset;
  }
  return nullptr;
}

struct TempDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("troupe-web-" + std::to_string(std::random_device{}()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
  }
};

}  // namespace

TEST_CASE("the page is in the binary and served at / with its files", "[net][web]") {
  const WebAsset* index = embedded("index.html");
  REQUIRE(index != nullptr);
  ServerConfig config;
  config.api_key = "sk-secret";  // the page loads without it: it asks for the key
  RouteContext context;
  context.config = &config;

  const Response page = get(context, "/");
  CHECK(page.result_int() == 200);
  CHECK(page.body() == index->body);
  CHECK(header(page, "Content-Type") == "text/html; charset=utf-8");
  CHECK(header(page, "ETag") == index->etag);
  CHECK(header(page, "Cache-Control") == "no-cache");
  CHECK(header(page, "X-Content-Type-Options") == "nosniff");
  const std::string policy = header(page, "Content-Security-Policy");
  CHECK_THAT(policy, Catch::Contains("default-src 'none'"));
  CHECK_THAT(policy, Catch::Contains("script-src 'self';"));
  CHECK_THAT(policy, Catch::Contains("connect-src 'self';"));
  CHECK_THAT(policy, Catch::Contains("frame-ancestors 'none'"));

  for (const WebAsset& asset : web_assets()) {
    INFO(asset.name);
    const Response file = get(context, "/" + std::string(asset.name) + "?v=1");
    CHECK(file.result_int() == 200);
    CHECK(file.body() == asset.body);
  }
  CHECK(get(context, "/index.html").body() == index->body);
  // The API still wants the key.
  CHECK(get(context, "/v1/models").result_int() == 401);
}

TEST_CASE("the page's files are fetched again only when they changed", "[net][web]") {
  ServerConfig config;
  RouteContext context;
  context.config = &config;
  const std::string etag = header(get(context, "/"), "ETag");
  REQUIRE(etag.size() > 2);

  Request again{http::verb::get, "/", 11};
  again.set(http::field::if_none_match, etag);
  const Response unchanged = route(again, context);
  CHECK(unchanged.result_int() == 304);
  CHECK(unchanged.body().empty());
  CHECK(header(unchanged, "Content-Length") == "<none>");  // not 0: the 200's would be more
  CHECK(header(unchanged, "ETag") == etag);

  // A list, a weak tag, or any tag at all: still unchanged.
  for (const std::string& tags : {"\"another\", " + etag, "W/" + etag, std::string("*")}) {
    INFO(tags);
    again.set(http::field::if_none_match, tags);
    CHECK(route(again, context).result_int() == 304);
  }
  again.set(http::field::if_none_match, "\"another\"");
  CHECK(route(again, context).result_int() == 200);
  again.method(http::verb::head);
  again.set(http::field::if_none_match, etag);
  const Response head_unchanged = route(again, context);
  CHECK(head_unchanged.result_int() == 304);
  CHECK(header(head_unchanged, "Content-Length") == "<none>");

  const Response head = get(context, "/", http::verb::head);
  CHECK(head.result_int() == 200);
  CHECK(head.body().empty());
  CHECK(header(head, "Content-Length") == std::to_string(embedded("index.html")->body.size()));
}

TEST_CASE("nothing but the page's own files is served", "[net][web]") {
  ServerConfig config;
  RouteContext context;
  context.config = &config;
  for (const char* target : {"/../CMakeLists.txt", "/..%2Fweb_assets.cpp", "/.index.html",
                             "/web/index.html", "/no-such-file.js", "/index.html/", "/index"}) {
    INFO(target);
    CHECK(get(context, target).result_int() == 404);
  }
  CHECK(get(context, "/", http::verb::post).result_int() != 200);
  CHECK(get(context, "/", http::verb::delete_).result_int() != 200);

  SECTION("--disable-web-page: no page at all") {
    config.web_page = false;
    CHECK(get(context, "/").result_int() == 404);
    CHECK(get(context, "/index.html").result_int() == 404);
  }
}

TEST_CASE("with --web-dir a directory's files are served, read at each request", "[net][web]") {
  const TempDir dir;
  dir.write("index.html", "<!doctype html><title>one</title>");
  dir.write("app.js", "export const x = 1;\n");
  dir.write("notes.txt", "not a page file");
  std::filesystem::create_directories(dir.path / "sub");
  dir.write("sub/inner.js", "no");
  ServerConfig config;
  config.web_dir = dir.path.string();
  RouteContext context;
  context.config = &config;

  const Response first = get(context, "/");
  CHECK(first.body() == "<!doctype html><title>one</title>");
  const Response script = get(context, "/app.js");
  CHECK(script.result_int() == 200);
  CHECK(header(script, "Content-Type") == "text/javascript; charset=utf-8");
  CHECK(get(context, "/notes.txt").result_int() == 404);  // not a type the page is made of
  CHECK(get(context, "/sub/inner.js").result_int() == 404);
  CHECK(get(context, "/style.css").result_int() == 404);  // embedded ones are not mixed in

  dir.write("index.html", "<!doctype html><title>two</title>");
  const Response second = get(context, "/");
  CHECK(second.body() == "<!doctype html><title>two</title>");
  CHECK(header(second, "ETag") != header(first, "ETag"));
}

TEST_CASE("requests for the page count under two route labels", "[net][web]") {
  CHECK(route_label("/") == "/");
  CHECK(route_label("/live.js") == "/{file}");
  CHECK(route_label("/anything.css") == "/{file}");
  CHECK(route_label("/etc/passwd") == "other");
  CHECK(route_label("/health") == "/health");
}

TEST_CASE("the page keeps to its policy: no inline code, and every file it names is there",
          "[net][web]") {
  const WebAsset* index = embedded("index.html");
  REQUIRE(index != nullptr);
  std::set<std::string> names;
  for (const WebAsset& asset : web_assets()) names.emplace(asset.name);
  for (const WebAsset& asset : web_assets()) {
    if (!asset.name.ends_with(".html") && !asset.name.ends_with(".js")) continue;
    INFO(asset.name);
    const std::string text(asset.body);
    if (asset.name.ends_with(".html")) {
      // The policy refuses inline scripts, <style> and style="" (a console error).
      CHECK_FALSE(std::regex_search(text, std::regex(R"(<script(?![^>]*\bsrc=)[^>]*>)")));
      CHECK_FALSE(std::regex_search(text, std::regex(R"(<style\b)")));
      CHECK_FALSE(std::regex_search(text, std::regex(R"(\sstyle\s*=)")));
      CHECK_FALSE(std::regex_search(text, std::regex(R"(\son[a-z]+\s*=)")));  // onclick=
    }
    // Every local file referenced (src=, href=, import ... from) is embedded.
    const std::regex reference(
        R"re((?:src|href)="\.?/?([A-Za-z0-9._-]+\.(?:js|css|svg|png|ico))"|)re"
        R"re(from\s+["']\./([A-Za-z0-9._-]+\.js)["'])re");
    for (std::sregex_iterator it(text.begin(), text.end(), reference), end; it != end; ++it) {
      const std::string name = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
      INFO(name);
      CHECK(names.count(name) == 1);
    }
  }
}
