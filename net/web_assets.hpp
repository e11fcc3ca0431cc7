// The built-in page (net/web/): its files are compiled into the binary and served at
// GET / (index.html) and GET /<name>, as llama.cpp's server serves its own page. For
// developing the page, --web-dir serves a directory's files instead, read at each request.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace troupe::net {

struct WebAsset {
  std::string_view name;  // "index.html"
  std::string_view body;
  std::string_view etag;  // quoted, from the bytes' hash
};

// Every embedded file, by name.
std::span<const WebAsset> web_assets();

// Whether a request path has the shape of a page file: "/" or "/<name>.<served type>".
bool is_web_file_path(std::string_view path);

// A file as served: from the binary or from a directory.
struct WebFile {
  std::string content_type;
  std::string body;
  std::string etag;
};

// The file a request path names ("/" is index.html): an embedded one when `dir` is
// empty, else `dir`'s (a plain file named by one path segment of letters, digits, '.',
// '_' and '-', of a served type). None when there is no such file.
std::optional<WebFile> find_web_file(std::string_view path, const std::string& dir);

}  // namespace troupe::net
