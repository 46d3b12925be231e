#!/usr/bin/env bash
# GetStatus/Wait latency during a save storm, two daemons side by side (issue 17): the baseline
# binary and this tree's, each with its own state dir, run in alternating order for ROUNDS rounds
# (A B, B A, ...) so drift on a shared machine hits both alike. Raw results:
# bench/results/status_latency.jsonl (one line per daemon and round).
#   BASELINE=/work/baseline/ckptd  NEW=build/ckptd  ROUNDS=4  SECONDS_PER_ROUND=8  SAVERS=4
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
BASELINE="${BASELINE:-/work/baseline/ckptd}"
NEW="${NEW:-$BUILD/ckptd}"
ROUNDS="${ROUNDS:-4}"
SECS="${SECONDS_PER_ROUND:-8}"
SAVERS="${SAVERS:-4}"
OUT="$ROOT/bench/results"
STATE="${BENCH_DIR:-$ROOT/bench/state-status}"
mkdir -p "$OUT"
: > "$OUT/status_latency.jsonl"

run_one() {  # label binary round
  local dir="$STATE/$1"
  rm -rf "$dir" && mkdir -p "$dir"
  "$2" --state_dir="$dir" --staging_bytes_max=$((256 << 20)) --log_level=warn \
    > "$dir/ckptd.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do [ -S "$dir/ckptd.sock" ] && break; sleep 0.1; done
  "$BUILD/ckptd_bench_status_latency" --socket "$dir/ckptd.sock" --label "$1" --round "$3" \
    --savers "$SAVERS" --seconds "$SECS" | tee -a "$OUT/status_latency.jsonl"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap 'rm -rf "$STATE"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then
    run_one baseline "$BASELINE" "$r"; run_one new "$NEW" "$r"
  else
    run_one new "$NEW" "$r"; run_one baseline "$BASELINE" "$r"
  fi
done
python3 - "$OUT/status_latency.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(label, key):
    return statistics.median(r[key] for r in rows if r["label"] == label)
for key in ["saves", "status_p50_us", "status_p99_us", "wait_p50_us", "wait_p99_us"]:
    b, n = med("baseline", key), med("new", key)
    print(f"{key:15s} baseline {b:10.0f}  new {n:10.0f}  new/baseline {n / b if b else 0:.2f}")
PY
