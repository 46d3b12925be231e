#!/usr/bin/env bash
# make bench: builds, then runs every benchmark side by side in one run on this machine and writes
# the raw results to bench/results/<name>.jsonl (bench/RESULTS.md records the command, the machine
# and the ratios taken from them).
#   BENCH_TENSORS=32 BENCH_ROWS=1024  size of the reshard-load checkpoint (x 4096 float32 columns)
#   BENCH_DIR=<dir>                    where the daemon keeps its state (default: bench/state)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
OUT="$ROOT/bench/results"
STATE="${BENCH_DIR:-$ROOT/bench/state}"
mkdir -p "$OUT"

machine() {
  echo "{\"cpu\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)\", \"cores\": $(nproc)," \
       "\"mem_gib\": $(( $(grep MemTotal /proc/meminfo | awk '{print $2}') / 1048576 )), \"kernel\": \"$(uname -r)\"," \
       "\"data_fs\": \"$(df -T "$ROOT" | awk 'NR==2 {print $2}')\", \"date\": \"$(date -u +%FT%TZ)\"}"
}
machine > "$OUT/machine.json"

echo "bench: planner (100k tensors / 1M shards; decode reported separately)"
"$BUILD/ckptd_bench_planner" --reps 3 | tee "$OUT/planner.jsonl"

echo "bench: resharded vs same-layout load through the daemon"
rm -rf "$STATE" && mkdir -p "$STATE"
"$BUILD/ckptd" --state_dir="$STATE" --staging_bytes_max=$((2048 << 20)) --log_level=warn \
  > "$STATE/ckptd.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$STATE"' EXIT
for _ in $(seq 100); do [ -S "$STATE/ckptd.sock" ] && break; sleep 0.1; done
"$BUILD/ckptd_bench_reshard_load" --socket "$STATE/ckptd.sock" --daemon_pid "$PID" \
  --tensors "${BENCH_TENSORS:-32}" --rows "${BENCH_ROWS:-1024}" --reps 3 \
  | tee "$OUT/reshard_load.jsonl"
python3 "$ROOT/bench/summarize.py" "$OUT"
