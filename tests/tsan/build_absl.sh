#!/usr/bin/env bash
# Builds Debian 12's own abseil (the source package of the installed libabsl-dev, Debian's patches
# applied: same version, same inline namespace) with -fsanitize=thread into $1/install, for the
# ThreadSanitizer tier (make test-tsan). TSan only sees a mutex synchronize when the mutex's code
# is instrumented; the installed libabsl is not. Idempotent: skipped when $1/install exists.
# The source comes through apt from the machine's configured Debian archive, with a private apt
# state under $1 (the system's apt configuration is not touched).
set -euo pipefail
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"
[ -f "$OUT/install/lib/cmake/absl/abslConfig.cmake" ] && exit 0
VERSION="$(dpkg-query -W -f='${Version}' libabsl-dev)"
APT="$OUT/apt"
mkdir -p "$APT/sources" "$APT/state/lists/partial" "$APT/cache/archives/partial" "$OUT/src"
# deb-src entries for the same archive and suites as the system's deb entries.
sed -e 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
  > "$APT/sources/debian-src.sources"
APT_OPTS=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$APT/sources"
          -o "Dir::State=$APT/state" -o "Dir::Cache=$APT/cache" -o "Debug::NoLocking=1"
          -o "APT::Sandbox::User=root")
echo "tsan: fetching the source of abseil $VERSION"
apt-get "${APT_OPTS[@]}" -qq update
(cd "$OUT/src" && apt-get "${APT_OPTS[@]}" -qq source --download-only "abseil=$VERSION")
rm -rf "$OUT/src/abseil"
dpkg-source -x "$OUT/src"/abseil_*.dsc "$OUT/src/abseil" >/dev/null
echo "tsan: building abseil with -fsanitize=thread"
cmake -S "$OUT/src/abseil" -B "$OUT/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread" -DCMAKE_C_FLAGS="-fsanitize=thread" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DBUILD_TESTING=OFF -DABSL_PROPAGATE_CXX_STD=ON -DCMAKE_CXX_STANDARD=17 \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_PREFIX="$OUT/install" \
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5 >/dev/null
cmake --build "$OUT/build" --target install >/dev/null
