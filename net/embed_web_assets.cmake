# Writes the built-in page's files (net/web/) into one C++ source as byte arrays, with
# each file's ETag, so that the binary serves the page without files beside it.
# Run at build time: cmake -DWEB_DIR=<dir> -DOUT=<file.cpp> -P <this>.
cmake_minimum_required(VERSION 3.25)

file(GLOB files RELATIVE ${WEB_DIR} ${WEB_DIR}/*)
list(SORT files)

set(arrays "")
set(entries "")
set(index 0)
foreach(name IN LISTS files)
  # The types web_assets.cpp serves; anything else in the directory stays out.
  if(NOT name MATCHES "^[A-Za-z0-9][A-Za-z0-9._-]*\\.(html|css|js|svg|png|ico)$")
    continue()
  endif()
  file(READ ${WEB_DIR}/${name} hex HEX)
  file(SHA256 ${WEB_DIR}/${name} hash)
  string(SUBSTRING ${hash} 0 16 hash)
  string(LENGTH "${hex}" hex_length)
  math(EXPR size "${hex_length} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${hex}")
  string(APPEND arrays "const char kFile${index}[] = {${bytes} 0};\n")
  string(APPEND entries
         "    {\"${name}\", {kFile${index}, ${size}}, \"\\\"${hash}\\\"\"},\n")
  math(EXPR index "${index} + 1")
endforeach()

file(WRITE ${OUT}.tmp "// Generated from net/web/ by net/embed_web_assets.cmake: do not edit.
#include \"net/web_assets.hpp\"

namespace troupe::net {
namespace {
${arrays}
const WebAsset kAssets[] = {
${entries}    {{}, {}, {}},
};
}  // namespace

std::span<const WebAsset> web_assets() {
  return {kAssets, ${index}};
}

}  // namespace troupe::net
")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
