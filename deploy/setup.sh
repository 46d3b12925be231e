#!/usr/bin/env bash
# Installs what ckptd's build and tests need, only when missing. Idempotent; run as root on a fresh
# Debian 12 machine (make run / make test call it). Set CKPTD_SKIP_SETUP=1 to skip.
set -euo pipefail
[ "${CKPTD_SKIP_SETUP:-0}" = 1 ] && exit 0

DEB_PKGS=(
  build-essential pkg-config cmake ninja-build
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev liburing-dev libspdlog-dev libfmt-dev catch2 libabsl-dev
  libcurl4-openssl-dev libssl-dev
)

missing=()
for p in "${DEB_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
