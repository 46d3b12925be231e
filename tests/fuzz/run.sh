#!/usr/bin/env bash
# The fuzzing smoke run of `make test-fuzz`: for each fuzzer, replay its regressions
# (tests/fuzz/regressions/<name>/*), then fuzz for SECONDS from its committed corpus. New corpus
# inputs go to BUILD/fuzz-work/<name> (the tree stays as it is), crash inputs to
# BUILD/fuzz-artifacts/<name>-*, logs to BUILD/fuzz-logs/<name>.log. JOBS fuzzers run at once.
# Prints "fuzz <name>: N runs, 0 crashes" per fuzzer; exits 1 if any crashed.
#   usage: run.sh BUILD [SECONDS [JOBS]]
set -euo pipefail

if [ "${1:-}" = "--one" ]; then
  name=$2
  bin="$FUZZ_BUILD/tests/fuzz/${name}_fuzz"
  log="$FUZZ_BUILD/fuzz-logs/$name.log"
  work="$FUZZ_BUILD/fuzz-work/$name"
  artifacts="$FUZZ_BUILD/fuzz-artifacts"
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  : >"$log"
  fail() {
    echo "fuzz $name: CRASHED ($1); log $log, input under $artifacts/$name-*:"
    grep -E "fuzz property failed|ERROR:|SUMMARY:|runtime error|CHECK failed" "$log" | head -5 |
      sed 's/^/  /'
    exit 1
  }
  regressions=("$FUZZ_SRC/regressions/$name"/*)
  if [ -e "${regressions[0]}" ]; then
    "$bin" -artifact_prefix="$artifacts/$name-" "${regressions[@]}" >>"$log" 2>&1 ||
      fail "replaying regressions/$name"
  fi
  "$bin" -max_total_time="$FUZZ_SECONDS" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/$name-" "$work" "$FUZZ_SRC/corpus/$name" >>"$log" 2>&1 ||
    fail "fuzzing"
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  echo "fuzz $name: ${runs:-?} runs, 0 crashes"
  exit 0
fi

FUZZ_BUILD=$(cd "$1" && pwd)
FUZZ_SECONDS=${2:-20}
JOBS=${3:-2}
FUZZ_SRC=$(cd "$(dirname "$0")" && pwd)
export FUZZ_BUILD FUZZ_SECONDS FUZZ_SRC
# Symbolized stacks in crash reports; UBSan findings stop the run (the build also says so).
ASAN_SYMBOLIZER_PATH=$(command -v llvm-symbolizer-15 || command -v llvm-symbolizer || true)
export ASAN_SYMBOLIZER_PATH
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

FUZZERS=(manifest index region reshard_spec save_request load_plan codec)
if printf '%s\n' "${FUZZERS[@]}" | xargs -P "$JOBS" -n 1 "$0" --one; then
  exit 0
fi
echo "fuzz: a fuzzer crashed (see above)" >&2
exit 1
