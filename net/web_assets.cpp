#include "net/web_assets.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

namespace troupe::net {

namespace {

constexpr std::array<std::pair<std::string_view, std::string_view>, 6> kTypes = {{
    {".html", "text/html; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},
    {".js", "text/javascript; charset=utf-8"},
    {".svg", "image/svg+xml"},
    {".png", "image/png"},
    {".ico", "image/x-icon"},
}};

// The file name a path asks for; empty when it is not one plain name.
std::string_view file_name(std::string_view path) {
  if (!path.starts_with('/')) return {};
  std::string_view name = path.substr(1);
  if (name.empty()) return "index.html";
  const bool plain = std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
  return plain && name.front() != '.' ? name : std::string_view{};
}

std::string_view content_type_of(std::string_view name) {
  for (const auto& [ext, type] : kTypes) {
    if (name.size() > ext.size() && name.ends_with(ext)) return type;
  }
  return {};
}

// FNV-1a over the bytes, quoted: a changed file gets another tag.
std::string etag_of(std::string_view body) {
  std::uint64_t h = 14695981039346656037ull;
  for (const char c : body) {
    h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  char text[24];
  std::snprintf(text, sizeof text, "\"%016llx\"", static_cast<unsigned long long>(h));
  return text;
}

}  // namespace

bool is_web_file_path(std::string_view path) {
  return !content_type_of(file_name(path)).empty();
}

std::optional<WebFile> find_web_file(std::string_view path, const std::string& dir) {
  const std::string_view name = file_name(path);
  const std::string_view type = content_type_of(name);
  if (type.empty()) return std::nullopt;
  if (dir.empty()) {
    for (const WebAsset& asset : web_assets()) {
      if (asset.name == name) {
        return WebFile{std::string(type), std::string(asset.body), std::string(asset.etag)};
      }
    }
    return std::nullopt;
  }
  const std::filesystem::path file = std::filesystem::path(dir) / name;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return std::nullopt;
  std::ifstream in(file, std::ios::binary);
  std::string body{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (!in.good() && !in.eof()) return std::nullopt;
  std::string etag = etag_of(body);
  return WebFile{std::string(type), std::move(body), std::move(etag)};
}

}  // namespace troupe::net
