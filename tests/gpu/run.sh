#!/usr/bin/env bash
# The GPU check (issues 13 and 38), run on a machine with an NVIDIA GPU from the repository root
# with the bundle of tests/gpu/bundle.sh in .gpu/: every [gpu] C++ integration case, the Python
# GPU tests (tests/python/test_gpu.py and the GPU cases of test_client.py) and
# bench/gpu_bench.py with its baselines. Each stage runs whatever the one before did. Wheels in
# .whl/ (DeepSpeed and what it needs beyond the machine's packages, see bench/RESULTS.md) are
# installed into /tmp/site first, so the DeepSpeed cases run. The logs and the benchmark's JSON
# go to $OUT (or ./gpu-out): the main ones as files, everything in gpu-logs.tar.gz (at most 8
# files, as a lent machine brings back). Budget: about 5 minutes with the default timeouts.
set -uo pipefail
STAGES=${STAGES:-cpp py bench}  # which of the three stages below run
GIB=${GIB:-2}                   # the benchmark's state on the GPU, GiB
PYK=${PYK:-gpu or cuda}         # the Python tests run (pytest -k)
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/gpu-logs.XXXX)  # every log; tarred into $OUT at the end
X=$ROOT/.gpu/x
mkdir -p "$X" && tar -C "$X" -xJf "$ROOT/.gpu/bundle.tar.xz"
# The Python sources of this tree over the bundle's (they need no build), subpackages included.
tar -C client/python --exclude=__pycache__ -cf - ckptd | tar -C "$X/py" -xf -
export LD_LIBRARY_PATH=$X/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$X/py${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl 2>&1 | tail -3 && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
export PYTHONUNBUFFERED=1
# The test binaries were built with these paths compiled in.
mkdir -p /work/main/build/tests
ln -sf "$X/bin/ckptd" /work/main/build/ckptd
ln -sf "$X/bin/ckptctl" /work/main/build/ckptctl
ln -sf "$X/bin/ckptd_testclient" /work/main/build/tests/ckptd_testclient
{
  date -u; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  df -h /dev/shm /tmp; lsblk -d -o NAME,SIZE,ROTA,MODEL 2>/dev/null; nproc; free -g
  python3 --version
  python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.device_count())'
  python3 -c 'import deepspeed; print("deepspeed", deepspeed.__version__)' 2>&1 | tail -1
  ldd "$X/bin/ckptd" | grep "not found" || echo "ckptd: all libraries found"
} 2>&1 | tee "$W/machine.txt"

if [[ $STAGES == *cpp* ]]; then
  echo "== C++ [gpu] cases"
  timeout 90 "$X/bin/ckptd_integration_tests" "[gpu]" -d yes >"$W/cpp_gpu.log" 2>&1
  echo "rc=$?" >>"$W/cpp_gpu.log"
  grep -E "^[0-9.]+ s: |FAILED|passed|failed|rc=" "$W/cpp_gpu.log" | tail -30
fi
if [[ $STAGES == *py* ]]; then
  echo "== Python GPU tests"
  (cd tests/python && CKPTD_BIN=$X/bin/ckptd timeout 200 python3 -m pytest -p no:cacheprovider \
    -q -rA --durations=15 test_gpu.py test_client.py -k "$PYK" >"$W/py_gpu.log" 2>&1
  echo "rc=$?" >>"$W/py_gpu.log")
  grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|rc=" "$W/py_gpu.log" | tail -40
fi
if [[ $STAGES == *bench* ]]; then
  echo "== bench/gpu_bench.py"
  SHM_FREE_GIB=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)
  ARENA_GIB=$((SHM_FREE_GIB > 14 ? 8 : SHM_FREE_GIB / 2))
  STATE=$(mktemp -d /tmp/ckgpu.XXXX)
  COLD=$(mktemp -d /tmp/ckgpu-cold.XXXX)
  "$X/bin/ckptd" --state_dir="$STATE" --staging_bytes_max=$((ARENA_GIB << 30)) >"$W/bench_daemon.log" 2>&1 &
  DPID=$!
  # The cold restore's daemon: its RAM tier off, so loads read its local tier.
  "$X/bin/ckptd" --state_dir="$COLD" --staging_bytes_max=$((ARENA_GIB << 29)) --ram_tier_keep_per_job=0 \
    >"$W/bench_cold_daemon.log" 2>&1 &
  CPID=$!
  for _ in $(seq 300); do [ -S "$STATE/ckptd.sock" ] && [ -S "$COLD/ckptd.sock" ] && break; sleep 0.1; done
  GIB=$(python3 -c "print(min($GIB, $ARENA_GIB / 3))")
  CKPTD_SOCKET=$STATE/ckptd.sock CKPTD_COLD_SOCKET=$COLD/ckptd.sock BENCH_DIR=/tmp timeout 200 \
    python3 bench/gpu_bench.py --gib "$GIB" --rounds 5 --disk_dir "$COLD" --out "$W/gpu_bench.json" \
    >"$W/bench.log" 2>&1
  echo "rc=$?" >>"$W/bench.log"
  kill "$DPID" "$CPID"; wait "$DPID" "$CPID"
  # Their checkpoints and arenas go (a second run on the same machine would find its disk full).
  python3 -c 'import sys; from ckptd._shm import remove_segments; [remove_segments(p) for p in sys.argv[1:]]' \
    "$STATE" "$COLD"
  rm -rf "$STATE" "$COLD"
  tail -5 "$W/bench.log"
  # The figures against their goals (issue 38).
  python3 - "$W/gpu_bench.json" <<'EOF' 2>&1 | tee "$W/summary.txt"
import json, sys
r = json.load(open(sys.argv[1]))
print(r["device"], r["torch"], f'{r["gib"]} GiB in {r["tensors"]} tensors')
d, h, a = r["d2h"], r["h2d"], r["async_save"]
print(f'D2H staging   {d["ckptd_save_gbps"]:.1f} vs pinned copy_ {d["pinned_copy_gbps"]:.1f} GB/s: {d["ratio"]:.3f}x (goal >= 0.9)')
print(f'H2D RAM tier  {h["ckptd_load_gbps"]:.1f} vs pinned copy_ {h["pinned_copy_gbps"]:.1f} GB/s: {h["ratio"]:.3f}x (goal >= 0.9); host load {h["ckptd_load_to_host_gbps"]:.2f} GB/s; counts {h["last_load_counts"]}')
if "h2d_cold" in r:
    c = r["h2d_cold"]
    print(f'H2D cold      {c["ckptd_load_gbps"]:.2f} GB/s vs disk O_DIRECT read {c.get("disk_read_gbps", 0):.2f} (best {c.get("disk_read_best_gbps", 0):.2f}): {c.get("vs_disk", 0):.3f}x ({c.get("vs_disk_best", 0):.3f}x best); vs pinned copy_ {c["ratio"]:.3f}x; counts {c["last_load_counts"]}')
print(f'async_save    stall {a["ckptd_stall_s"]*1e3:.1f} ms (socket=) / {a["ckptd_shared_client_stall_s"]*1e3:.1f} ms (process-wide) vs DCP {a["dcp_stall_s"]*1e3:.1f} ms: {a["ratio"]:.3f}x / {a["shared_client_ratio"]:.3f}x (goal <= 0.1)')
print("gpu_fallback_bytes", r["gpu_fallback_bytes"])
EOF
  tail -5 "$W/bench_daemon.log" >>"$W/summary.txt"
fi
tar -C "$W" -czf "$OUT/gpu-logs.tar.gz" .
for f in machine.txt cpp_gpu.log py_gpu.log gpu_bench.json summary.txt; do
  [ -f "$W/$f" ] && cp "$W/$f" "$OUT/"
done
ls -la "$OUT"
