#!/usr/bin/env bash
# The GPU check (issue 13), run on a machine with an NVIDIA GPU from the repository root with the
# bundle of tests/gpu/bundle.sh in .gpu/: the [gpu] C++ integration cases, the Python GPU tests
# and bench/gpu_bench.py. Each stage runs whatever the one before did; logs and results go to
# $OUT (or ./gpu-out).
set -uo pipefail
STAGES=${STAGES:-cpp py bench}  # which of the three stages below run
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
X=$ROOT/.gpu/x
mkdir -p "$X" && tar -C "$X" -xJf "$ROOT/.gpu/bundle.tar.xz"
# The Python sources of this tree over the bundle's (they need no build).
cp client/python/ckptd/*.py "$X/py/ckptd/" && cp plugins/torch/ckptd/torch/*.py "$X/py/ckptd/torch/"
export LD_LIBRARY_PATH=$X/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$X/py${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
# The test binaries were built with these paths compiled in.
mkdir -p /work/main/build/tests
ln -sf "$X/bin/ckptd" /work/main/build/ckptd
ln -sf "$X/bin/ckptctl" /work/main/build/ckptctl
ln -sf "$X/bin/ckptd_testclient" /work/main/build/tests/ckptd_testclient
{
  nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  df -h /dev/shm /tmp; nproc; free -g; python3 --version
  python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available())'
  ldd "$X/bin/ckptd" | grep "not found" || echo "ckptd: all libraries found"
} 2>&1 | tee "$OUT/machine.txt"

if [[ $STAGES == *cpp* ]]; then
echo "== C++ [gpu] cases"
timeout 120 "$X/bin/ckptd_integration_tests" "[gpu]" 2>&1 | tail -60 | tee "$OUT/cpp_gpu.log"

fi
if [[ $STAGES == *py* ]]; then
echo "== Python GPU tests"
(cd tests/python && CKPTD_BIN=$X/bin/ckptd timeout 180 python3 -m pytest -p no:cacheprovider -q -s -rA \
  test_gpu.py test_client.py -k "gpu or cuda" 2>&1 | tail -120) | tee "$OUT/py_gpu.log"

fi
[[ $STAGES == *bench* ]] || exit 0
echo "== bench/gpu_bench.py"
SHM_FREE_GIB=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)
ARENA_GIB=$(( SHM_FREE_GIB > 14 ? 8 : SHM_FREE_GIB / 2 ))
STATE=$(mktemp -d /tmp/ckgpu.XXXX)
COLD=$(mktemp -d /tmp/ckgpu-cold.XXXX)
"$X/bin/ckptd" --state_dir="$STATE" --staging_bytes_max=$((ARENA_GIB << 30)) >"$OUT/bench_daemon.log" 2>&1 &
DPID=$!
# The cold restore's daemon: its RAM tier off, so loads read its local tier.
"$X/bin/ckptd" --state_dir="$COLD" --staging_bytes_max=$((ARENA_GIB << 29)) --ram_tier_keep_per_job=0 \
  >"$OUT/bench_cold_daemon.log" 2>&1 &
CPID=$!
for _ in $(seq 100); do [ -S "$STATE/ckptd.sock" ] && [ -S "$COLD/ckptd.sock" ] && break; sleep 0.1; done
GIB=$(python3 -c "print(min(2.0, $ARENA_GIB / 3))")
CKPTD_SOCKET=$STATE/ckptd.sock CKPTD_COLD_SOCKET=$COLD/ckptd.sock BENCH_DIR=/tmp timeout 300 \
  python3 bench/gpu_bench.py --gib "$GIB" --rounds 5 --out "$OUT/gpu_bench.json" 2>&1 | tail -80 |
  tee "$OUT/bench.log"
kill "$DPID" "$CPID"; wait "$DPID" "$CPID"
tail -20 "$OUT/bench_daemon.log"
