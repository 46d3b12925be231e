#!/usr/bin/env bash
# make bench: builds, then runs every benchmark side by side in one run on this machine and writes
# the raw results to bench/results/<name>.jsonl (bench/RESULTS.md records the command, the machine
# and the ratios taken from them).
#   BENCH_TENSORS=32 BENCH_ROWS=1024  size of the reshard-load checkpoint (x 4096 float32 columns)
#   BENCH_DIR=<dir>                    where the daemon keeps its state (default: bench/state)
#   BENCH_STATE_GB=2 BENCH_DTYPES=fp32,bf16 BENCH_WORLDS=1,2,4     the checkpoint comparison
#   BENCH_SYSTEMS=ckptd,ckptd_dcp,dcp,dcp_async,torch_save,bytecheckpoint  (the comparison)
#   BENCH_TRAIN_SYSTEMS=...  the training loop (default: all of train_bench.py, ckptd_zoc and
#                            dcp_zoc included: DCP's two-future recipe, ckptd against DefaultStager)
#   BENCH_TRAIN_ROUNDS=8 BENCH_TRAIN_EVERY=5    the training-loop overhead (blocks of 5 steps)
#   BENCH_EVERY_ROUNDS=5 BENCH_EVERY_STEPS=10 BENCH_EVERY_SYSTEMS=...  checkpointing every step
#                            and every 10 steps: runs of 10 steps, overhead per step (every_step)
#   BENCH_DELTA_MIB=512 BENCH_DELTA_STEPS=8   deltas on a LoRA-style job (1% of the state changing
#                            per step): time to committed and bytes written, on against off (delta)
#   BENCH_BALANCED_MIB=256 BENCH_BALANCED_WORLD=4   planless saves of replicated state: balanced
#                            writers against rank 0 writing it all (balanced)
#   BENCH_REPS=3                               repetitions of ckptd's saves/loads and of memcpy
#   BENCH_REMOTE_GB=1 BENCH_REMOTE_ROUNDS=3   the remote tier on S3 (bench/remote_bench.py: a local
#                            SeaweedFS `weed` on loopback; ckptd's upload/download/resharded load
#                            against boto3's s3transfer and the disk, rounds interleaved)
#   BENCH_REMOTE_PART_MIB=8 BENCH_REMOTE_PARTS_IN_FLIGHT=8   part size and concurrency of both
#   BENCH_REMOTE_SYSTEMS=ckptd,s3transfer,disk_read  (add s3transfer_signed: boto3's
#                            default config over http, SHA-256 of every part)
#   BENCH_CLUSTER_ROUNDS=9   checkpoints spanning nodes (bench/cluster_merge_bench.cc,
#                            bench/cluster_commit_bench.py: 1, 2 and 3 daemons on a shared dir)
#   BENCH_PEER_RESTORE_MIB=256 BENCH_PEER_RESTORE_ROUNDS=5   time to resume after a node's loss:
#                            a replacement node's 2 ranks (MiB each) loaded from the peer holding
#                            its part, against the store (a directory, cold; SeaweedFS on
#                            loopback) and the lost node's own RAM tier (3 daemons on a shared
#                            dir; bench/peer_restore_bench.py; rounds rotate the order)
#   BENCH_COMMIT_MIB=512 BENCH_COMMIT_ROUNDS=9   time to committed against fio in the daemon's
#                            write shape and dd (bench/commit_floor.py; rounds rotate the order)
#   BENCH_RESTORE_MIB=1024 BENCH_RESTORE_ROUNDS=3 BENCH_RESTORE_WORLDS=1,4   restores from the
#                            RAM tier against a memcpy of the state and a load from disk
#                            (bench/restore_bench.py; rounds rotate the order)
#   BENCH_COLD_MIB=1024 BENCH_COLD_ROUNDS=3   cold restores (page cache dropped, RAM tier empty)
#                            against torch.load and fio's reads (bench/cold_restore_bench.py)
#   BENCH_WARM_MIB=1024 BENCH_WARM_ROUNDS=5   warm restores: ckptd from the RAM tier against
#                            DCP's load with the page cache warm and torch.load
#                            (bench/warm_restore_bench.py; rounds rotate the order)
#   BENCH_RESUME_ROUNDS=5 BENCH_RESUME_SYSTEMS=none,ckptd,ckptd_cold,ckptd_torch,dcp_warm,dcp_cold,
#                            torch_warm,torch_cold   time to resume: a trainer (train_bench.py's GPT
#                            with Adam, 161 MB of state) killed with SIGKILL once its checkpoint
#                            is durable, a new one timed from its start to the end of its first
#                            step after restoring (bench/resume_bench.py; rounds rotate the order)
#   BENCH_RESUME_ARENA_MIB=512               each of resume_bench's two daemons' staging arena
#   BENCH_REPLICATED_MIB=1024 BENCH_REPLICATED_ROUNDS=3   four ranks restoring the same state:
#                            the prefetch hint, load_io direct/buffered/auto, page cache cold and
#                            warm, and the daemon's device reads (bench/replicated_restore_bench.py)
#   BENCH_DS_DIMS=1024,4096,32768,7 BENCH_DS_TRAIN_DP=2 BENCH_DS_RESUME_DP=4   DeepSpeed ZeRO-2
#                            resumed at another DP size: ckptd.deepspeed against save_checkpoint +
#                            ds_to_universal + load_universal (bench/deepspeed_bench.py)
#   BENCH_IMPORT_MIB=1024 BENCH_IMPORT_ROUNDS=2   each importer's throughput against the disk's
#                            best sequential read (bench/import_bench.py)
#   BENCH_SAVE_ITEMS=1000,100000   a Save's staging time against its item count
#                            (bench/save_validate_bench.cc: per-item time, 1.0 = linear)
#   BENCH_FRAMEWORK_REPS=5   training-loop overhead per checkpoint through TorchTitan's checkpoint
#                            manager (ckptd against its DCP async) and Lightning's CheckpointIO
#                            (ckptd's two against TorchCheckpointIO) (bench/framework_bench.py)
#   BENCH_PLANNING_WORLDS=16,128,1000,10000 BENCH_PLANNING_TENSORS=16   DCP's coordination cost
#                            per rank and on the coordinator (rank 0) at simulated world sizes, DCP's
#                            own writer/reader against ckptd.torch's (bench/planning_scale_bench.py)
#   BENCH_ONLY=all|planner|save_validate|reshard|ckpt|commit|restore|cold|warm|resume|replicated|train|every_step|delta|balanced|remote|cluster|peer
#              |peer_restore|deepspeed|import|framework|planning
#                            run one part only
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

ONLY="${BENCH_ONLY:-all}"
bash "$ROOT/bench/setup_peers.sh"

if [ "$ONLY" = all ] || [ "$ONLY" = planner ]; then
echo "bench: planner (100k tensors / 1M shards; decode reported separately)"
"$BUILD/ckptd_bench_planner" --reps 3 | tee "$OUT/planner.jsonl"

fi

if [ "$ONLY" = all ] || [ "$ONLY" = planning ]; then
echo "bench: DCP's planning at simulated world sizes: per rank and on the coordinator (no daemon)"
python3 "$ROOT/bench/planning_scale_bench.py" --worlds "${BENCH_PLANNING_WORLDS:-16,128,1000,10000}" \
  --tensors "${BENCH_PLANNING_TENSORS:-16}" --out "$OUT/planning_scale.jsonl"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = save_validate ]; then
echo "bench: a Save's staging time against its item count (linear validation)"
"$BUILD/ckptd_bench_save_validate" --daemon "$BUILD/ckptd" --items "${BENCH_SAVE_ITEMS:-1000,100000}" \
  --reps 3 | tee "$OUT/save_validate.jsonl"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = peer ]; then
echo "bench: the peer channel's PutBlob against a raw TCP copy over loopback (goal >= 0.9x)"
rm -rf "$OUT/peer-certs"
for a in "ca $OUT/peer-certs ca" "node $OUT/peer-certs ca node-a" "node $OUT/peer-certs ca node-b"; do
  # shellcheck disable=SC2086
  sh "$ROOT/tests/integration/peer_certs.sh" $a
done
"$BUILD/ckptd_peer_bench" bench --certs "$OUT/peer-certs" --bytes "${BENCH_PEER_BYTES:-1073741824}" \
  --rounds 5 | tee "$OUT/peer.txt"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = cluster ]; then
echo "bench: checkpoints spanning nodes (the coordinator's merge at 1k/10k ranks; commit latency)"
"$BUILD/ckptd_bench_cluster_merge" --ranks 1000,10000 --reps 3 | tee "$OUT/cluster_merge.jsonl"
python3 "$ROOT/bench/cluster_commit_bench.py" --daemon "$BUILD/ckptd" --out "$OUT" \
  --rounds "${BENCH_CLUSTER_ROUNDS:-9}"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = peer_restore ]; then
echo "bench: time to resume after a node's loss: ranks loaded from a peer, the store, the RAM tier"
python3 "$ROOT/bench/peer_restore_bench.py" --daemon "$BUILD/ckptd" \
  --out "$OUT/peer_restore.jsonl" --mib "${BENCH_PEER_RESTORE_MIB:-256}" \
  --rounds "${BENCH_PEER_RESTORE_ROUNDS:-5}"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = reshard ]; then
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
kill $PID; wait $PID 2>/dev/null || true; rm -rf "$STATE"; trap - EXIT
fi

if [ "$ONLY" = all ] || [ "$ONLY" = ckpt ]; then
echo "bench: ckptd against torch.save, DCP and ByteCheckpoint (${BENCH_STATE_GB:-2} GB of state)"
python3 "$ROOT/bench/ckpt_bench.py" --daemon "$BUILD/ckptd" --out "$OUT" --state-dir "$STATE" \
  --state-gb "${BENCH_STATE_GB:-2}" --dtypes "${BENCH_DTYPES:-fp32,bf16}" \
  --worlds "${BENCH_WORLDS:-1,2,4}" \
  --systems "${BENCH_SYSTEMS:-ckptd,ckptd_dcp,dcp,dcp_async,torch_save,bytecheckpoint}"
python3 "$ROOT/bench/plot.py" "$OUT/ckpt.jsonl" "$ROOT/bench/ckpt_phases.png"
rm -rf "$STATE"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = cold ]; then
echo "bench: cold restores (${BENCH_COLD_MIB:-1024} MiB) against torch.load and fio"
python3 "$ROOT/bench/cold_restore_bench.py" --daemon "$BUILD/ckptd" --dir "$STATE-cold" \
  --state-mib "${BENCH_COLD_MIB:-1024}" --rounds "${BENCH_COLD_ROUNDS:-3}" --out "$OUT/cold_restore.jsonl"
fi
if [ "$ONLY" = all ] || [ "$ONLY" = warm ]; then
echo "bench: warm restores (${BENCH_WARM_MIB:-1024} MiB): the RAM tier against DCP and torch.load"
python3 "$ROOT/bench/warm_restore_bench.py" --daemon "$BUILD/ckptd" --dir "$STATE-warm" \
  --state-mib "${BENCH_WARM_MIB:-1024}" --rounds "${BENCH_WARM_ROUNDS:-5}" \
  --out "$OUT/warm_restore.jsonl"
fi
if [ "$ONLY" = all ] || [ "$ONLY" = replicated ]; then
echo "bench: replicated restores (${BENCH_REPLICATED_MIB:-1024} MiB x 4 ranks): hint, load_io modes"
python3 "$ROOT/bench/replicated_restore_bench.py" --daemon "$BUILD/ckptd" --dir "$STATE-replicated" \
  --state-mib "${BENCH_REPLICATED_MIB:-1024}" --rounds "${BENCH_REPLICATED_ROUNDS:-3}" \
  --out "$OUT/replicated.jsonl"
fi
if [ "$ONLY" = all ] || [ "$ONLY" = resume ]; then
echo "bench: time to resume after a SIGKILL (ckptd RAM tier and cold, DCP, torch.save)"
python3 "$ROOT/bench/resume_bench.py" --daemon "$BUILD/ckptd" --work "$STATE-resume" \
  --rounds "${BENCH_RESUME_ROUNDS:-5}" --arena-mib "${BENCH_RESUME_ARENA_MIB:-512}" \
  ${BENCH_RESUME_SYSTEMS:+--systems "$BENCH_RESUME_SYSTEMS"} --out "$OUT/resume.jsonl"
fi
if [ "$ONLY" = all ] || [ "$ONLY" = restore ]; then
echo "bench: restores from the RAM tier (${BENCH_RESTORE_MIB:-1024} MiB) against memcpy and disk"
"$BUILD/ckptd_bench_verify_copy" --reps 3 | tee "$OUT/verify_copy.jsonl"
python3 "$ROOT/bench/restore_bench.py" --daemon "$BUILD/ckptd" --dir "$STATE-restore" \
  --bound "$BUILD/ckptd_bench_restore_bound" \
  --state-mib "${BENCH_RESTORE_MIB:-1024}" --rounds "${BENCH_RESTORE_ROUNDS:-3}" \
  --worlds "${BENCH_RESTORE_WORLDS:-1,4}" --out "$OUT/restore.jsonl"
rm -rf "$STATE-restore"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = commit ]; then
echo "bench: time to committed against the device's floor (${BENCH_COMMIT_MIB:-512} MiB)"
python3 "$ROOT/bench/commit_floor.py" --daemon "$BUILD/ckptd" --dir "$STATE-commit" \
  --size-mib "${BENCH_COMMIT_MIB:-512}" --rounds "${BENCH_COMMIT_ROUNDS:-9}" \
  --out "$OUT/commit_floor.jsonl"
rm -rf "$STATE-commit"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = train ]; then
echo "bench: training-loop overhead per checkpoint"
python3 "$ROOT/bench/train_bench.py" --daemon "$BUILD/ckptd" --out "$OUT" \
  --state-dir "$STATE-train" --rounds "${BENCH_TRAIN_ROUNDS:-8}" --every "${BENCH_TRAIN_EVERY:-5}" \
  ${BENCH_TRAIN_SYSTEMS:+--systems "$BENCH_TRAIN_SYSTEMS"}
rm -rf "$STATE-train"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = delta ]; then
echo "bench: deltas on a LoRA-style job (bytes written, time to committed; on against off)"
python3 "$ROOT/bench/delta_bench.py" --binary "$BUILD/ckptd" --out "$OUT" \
  --state-mib "${BENCH_DELTA_MIB:-512}" --steps "${BENCH_DELTA_STEPS:-8}"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = balanced ]; then
echo "bench: planless saves of replicated state (balanced writers against rank 0)"
python3 "$ROOT/bench/balanced_save_bench.py" --binary "$BUILD/ckptd" --out "$OUT" \
  --state-mib "${BENCH_BALANCED_MIB:-256}" --world "${BENCH_BALANCED_WORLD:-4}"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = every_step ]; then
echo "bench: checkpointing every step and every 10 steps (overhead per step)"
for every in 1 10; do
  python3 "$ROOT/bench/train_bench.py" --daemon "$BUILD/ckptd" --out "$OUT" \
    --state-dir "$STATE-train" --rounds "${BENCH_EVERY_ROUNDS:-5}" --every "$every" \
    --continuous "${BENCH_EVERY_STEPS:-10}" \
    --systems "${BENCH_EVERY_SYSTEMS:-none,io_floor,ckptd,ckptd_overlap,ckptd_zoc,dcp_async,dcp_zoc}"
  rm -rf "$STATE-train"
done
fi

if [ "$ONLY" = all ] || [ "$ONLY" = framework ]; then
echo "bench: training-loop overhead per checkpoint through TorchTitan and Lightning"
python3 "$ROOT/bench/framework_bench.py" --daemon "$BUILD/ckptd" --out "$OUT" \
  --work "$STATE-framework" --reps "${BENCH_FRAMEWORK_REPS:-5}"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = remote ]; then
echo "bench: remote tier on S3 (${BENCH_REMOTE_GB:-1} GiB, SeaweedFS on loopback) against s3transfer"
python3 "$ROOT/bench/remote_bench.py" --daemon "$BUILD/ckptd" --out "$OUT" \
  --work-dir "$STATE-remote" --gb "${BENCH_REMOTE_GB:-1}" --rounds "${BENCH_REMOTE_ROUNDS:-3}" \
  --part-mib "${BENCH_REMOTE_PART_MIB:-8}" --parts-in-flight "${BENCH_REMOTE_PARTS_IN_FLIGHT:-8}" \
  --systems "${BENCH_REMOTE_SYSTEMS:-ckptd,s3transfer,disk_read}"
fi

if [ "$ONLY" = all ] || [ "$ONLY" = deepspeed ]; then
echo "bench: DeepSpeed ZeRO-2 resumed at another DP size (ckptd.deepspeed against UCP)"
python3 "$ROOT/bench/deepspeed_bench.py" --binary "$BUILD/ckptd" --dir "$(dirname "$STATE")" \
  --dims "${BENCH_DS_DIMS:-1024,4096,32768,7}" --train_dp "${BENCH_DS_TRAIN_DP:-2}" \
  --resume_dp "${BENCH_DS_RESUME_DP:-4}" --out "$OUT/deepspeed.jsonl"
fi
if [ "$ONLY" = all ] || [ "$ONLY" = import ]; then
echo "bench: importers (${BENCH_IMPORT_MIB:-1024} MiB) against the disk's read bandwidth"
python3 "$ROOT/bench/import_bench.py" --daemon "$BUILD/ckptd" --dir "$STATE-import" \
  --mib "${BENCH_IMPORT_MIB:-1024}" --rounds "${BENCH_IMPORT_ROUNDS:-2}" --out "$OUT/import.jsonl"
rm -rf "$STATE-import"
fi

python3 "$ROOT/bench/summarize.py" "$OUT"
