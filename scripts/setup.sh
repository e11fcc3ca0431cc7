#!/usr/bin/env bash
# Installs what troupe needs to build and test, from Debian 12 packages only.
# Safe to run again: it installs only what is missing.
set -euo pipefail

packages=(
  cmake ninja-build ccache g++ make      # toolchain
  catch2                                 # tests
  libhwy-dev                             # CPU SIMD kernels
  libexpected-dev                        # troupe::Result
  libcli11-dev                           # command line
  libspdlog-dev                          # the server log (monitoring/log)
  libcaf-dev                             # actors (CAF 0.17)
  libssl-dev                             # OpenSSL: the cluster's TLS (a CAF bug mended in actors/)
  libboost1.81-dev libboost-json1.81-dev # HTTP (Asio, Beast) and JSON
  prometheus-cpp-dev                     # metrics registry and text format
  curl prometheus                        # the server tests' HTTP client; promtool
  python3-websockets                     # the WebSocket example (and its test)
  python3-jinja2                         # chat templates rendered by jinja2, to compare with
  python3-jsonschema                     # the validator the JSON schema grammar test checks against
  clang-format                           # style check
  clang libfuzzer-14-dev                 # fuzz targets (scripts/fuzz.sh)
  slowhttptest                           # slow-client tests of the HTTP server
  openssl                                # the cluster TLS test makes its certificates
  libgloo-dev                            # CPU collectives for tensor parallelism
  chromium                               # the live page's browser test (headless)
)

# Node.js runs the official openai client in the tests; any recent one will do.
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
