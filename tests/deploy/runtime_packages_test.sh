#!/usr/bin/env bash
# The container's runtime packages (examples/deploy/runtime-packages.txt, which the
# Dockerfile installs) against what the built troupe binary links: every NEEDED library
# must come from a package in the list (mapped with dpkg -S on this Debian machine), and
# every package in the list must give one. Exit 77 (skipped) where dpkg or readelf is
# absent. Usage: runtime_packages_test.sh TROUPE_BINARY SOURCE_DIR
set -euo pipefail

binary=$1
source_dir=$2
list=$source_dir/examples/deploy/runtime-packages.txt
dockerfile=$source_dir/examples/deploy/Dockerfile

skip() {
  echo "SKIPPED: $*"
  exit 77
}
command -v dpkg >/dev/null || skip "dpkg is absent: libraries cannot be mapped to Debian packages here"
command -v readelf >/dev/null || skip "readelf is absent (binutils)"
command -v ldd >/dev/null || skip "ldd is absent"

status=0
fail() {
  echo "FAIL: $*"
  status=1
}

# The Dockerfile installs the list itself, not a copy of it.
grep -q 'COPY examples/deploy/runtime-packages.txt' "$dockerfile" ||
  fail "the Dockerfile does not copy examples/deploy/runtime-packages.txt"
grep -qF "\$(sed 's/#.*//' /tmp/runtime-packages.txt)" "$dockerfile" ||
  fail "the Dockerfile does not install the packages of runtime-packages.txt"

mapfile -t packages < <(sed 's/#.*//' "$list" | tr -s ' \t' '\n' | grep -v '^$')
[ "${#packages[@]}" -gt 0 ] || fail "runtime-packages.txt lists no package"
# Membership by associative array, not `printf | grep -q`: under pipefail grep's early
# exit can kill printf with SIGPIPE and turn a match into a failure.
declare -A in_list=()
for package in "${packages[@]}"; do in_list[$package]=1; done
listed() { [ -n "${in_list[$1]:-}" ]; }

# CUDA's libraries come with NVIDIA's toolkit, not from Debian: a build with CUDA links
# them, and the image's build (-DTROUPE_CUDA=OFF) does not.
cuda_only='^lib(cudart|cublas|cublasLt|nccl|cuda)\.so'

# The package holding a library, as dpkg knows it: under its path as the loader finds it
# or as it resolves (Debian 12's merged /usr lists /lib paths).
package_of() {
  local path=$1 candidate owner
  for candidate in "$path" "$(readlink -f "$path")" "${path#/usr}"; do
    owner=$(dpkg -S "$candidate" 2>/dev/null | grep -v '^diversion' | head -1 | cut -d: -f1 | cut -d, -f1) || true
    if [ -n "$owner" ]; then
      echo "$owner"
      return
    fi
  done
}

needed=$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] || fail "readelf found no NEEDED entry in $binary"
loader=$(ldd "$binary")
declare -A used=()
for library in $needed; do
  path=$(awk -v l="$library" '$1 == l && $2 == "=>" { print $3 }' <<<"$loader")
  if [ -z "$path" ] || [ "$path" = "not" ]; then
    fail "$library: not found on this machine (ldd)"
    continue
  fi
  package=$(package_of "$path")
  if [ -z "$package" ]; then
    if [[ $library =~ $cuda_only ]]; then
      echo "ok: $library ($path) is CUDA's; the image's CPU build does not link it"
    else
      fail "$library ($path) belongs to no Debian package"
    fi
    continue
  fi
  if listed "$package"; then
    echo "ok: $library <- $package"
    used[$package]=1
  else
    fail "$library comes from the package $package, which runtime-packages.txt lacks"
  fi
done

for package in "${packages[@]}"; do
  [ -n "${used[$package]:-}" ] ||
    fail "$package is in runtime-packages.txt, but the binary links no library of it"
done

[ "$status" -eq 0 ] && echo "every library troupe links is installed by the image, and nothing else"
exit "$status"
