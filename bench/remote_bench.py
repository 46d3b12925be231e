"""ckptd's remote tier on a real S3 store (SeaweedFS on loopback) against boto3's s3transfer.

One run, every system side by side on the same machine, store and bytes, in interleaved rounds
(the order of the systems rotates each round; medians are reported):

  upload    ckptd: a checkpoint of --gb of float32 (--tensors tensors of --cols columns, saved
            row-sharded by 2 ranks: 2 blobs) is saved with tier policy local+remote; the time is
            from COMMITTED (wait() returning) to wait(until="remote") returning, the bytes the
            upload's bytes_total (blobs + manifest). The daemon streams each blob to the store
            (BlobWriter::CopyFrom: parts_in_flight parts in flight throughout, each read from
            the local file as a slot frees), as s3transfer does.
            s3transfer: TransferManager.upload of the same blob files (a copy of the daemon's
            files, page cache dropped for them first), multipart_chunksize = part size,
            max_concurrency = parts in flight, all files submitted at once; payload unsigned and
            no checksums (what ckptd sends: UNSIGNED-PAYLOAD; botocore signs the payload over
            http unless told not to). `s3transfer_signed` (opt-in, --systems) is boto3's
            default config over http (SHA-256 of every part for the signature, CRC32 checksum):
            the same library as most users run it against a plain-http store.
            disk: dd iflag=direct of the same files (the local read limit under the upload).
  download  a fresh daemon (empty state dir, same bucket and prefix) adopts the checkpoint from
            the store; ckptd loads every item into pre-faulted numpy arrays; s3transfer downloads
            the same blob objects with download (same part size and concurrency) to files.
  codec     with --systems ckptd_zstd: a second daemon with remote_codec=zstd (prefix "zstd")
            uploads the same checkpoint in the same rounds, interleaved with the others; its
            row adds the bytes stored (the blob objects on the store, against `ckptd`'s raw
            ones), and a fresh daemon on its prefix loads it whole (decoding; checked bit-exact in
            round 0).
  reshard   the fresh daemon loads a slice in another layout (a column block of a 4-way column
            split, an unaligned third of the columns, the middle third of the rows across the
            saved 2-rank boundary): bytes read (all from the store) against the needed bytes with
            each contiguous range rounded out to 4 KiB, computed here from the saved layout.

Writes one JSON object per measurement to --out/remote.jsonl and prints the ratio table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench_common import drop_file_caches

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
GiB = 1 << 30
GB = 1e9
ALIGN = 4096
ACCESS_KEY = "AKIDCKPTDBENCH000001"  # only this weed instance's identity file knows them
SECRET_KEY = "ckptd-bench-secret-not-a-real-one"
BUCKET = "ckptd-bench"
JOB = "remote-bench"
SAVE_RANKS = 2
MANIFEST = "manifest.ckm"


# --- processes --------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM to the process group `proc` leads, SIGKILL after grace_s, then reap."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever it left in its group
    except ProcessLookupError:
        pass


WEED_PID: dict[str, int] = {}  # "pid": the running weed server's


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_now(client_pid: int | None) -> tuple[float, float]:
    """(CPU seconds of the client side: the daemon `client_pid`, else this process; of weed)."""
    if client_pid is None:
        t = os.times()
        mine = t.user + t.system
    else:
        mine = proc_cpu_s(client_pid)
    return mine, proc_cpu_s(WEED_PID["pid"])


def cpu_since(before: tuple[float, float], client_pid: int | None) -> dict[str, float]:
    now = cpu_now(client_pid)
    return {"cpu_client_s": now[0] - before[0], "cpu_store_s": now[1] - before[1]}


def s3_client(endpoint: str, concurrency: int, signed: bool = False) -> Any:
    import boto3
    from botocore.config import Config

    s3: dict[str, Any] = {"addressing_style": "path"}
    extra: dict[str, Any] = {}
    if not signed:
        s3["payload_signing_enabled"] = False
        extra = {
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
        }
    cfg = Config(s3=s3, max_pool_connections=concurrency + 4, retries={"mode": "standard"}, **extra)
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=cfg,
    )


@contextmanager
def weed_server(weed: str, work: Path) -> Iterator[str]:
    """`weed server` (master, volume, filer, S3 gateway) on loopback with free ports, the
    command line of tests/s3/s3_harness.cc; yields the S3 endpoint once the bucket exists."""
    (work / "data").mkdir(parents=True, exist_ok=True)
    ident = {
        "identities": [
            {
                "name": "ckptd-bench",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    (work / "s3.json").write_text(json.dumps(ident))
    p = {k: free_port() for k in ("m", "mg", "v", "vg", "f", "fg", "s3", "s3g")}
    argv = [
        weed,
        "server",
        f"-dir={work}/data",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={p['m']}",
        f"-master.port.grpc={p['mg']}",
        f"-volume.port={p['v']}",
        f"-volume.port.grpc={p['vg']}",
        "-filer",
        f"-filer.port={p['f']}",
        f"-filer.port.grpc={p['fg']}",
        f"-filer.localSocket={work}/filer.sock",
        "-s3",
        f"-s3.port={p['s3']}",
        f"-s3.port.grpc={p['s3g']}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={work}/s3.json",
        "-master.volumeSizeLimitMB=64",
        "-volume.max=0",
    ]
    with open(work / "weed.log", "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    endpoint = f"http://127.0.0.1:{p['s3']}"
    WEED_PID["pid"] = proc.pid
    try:
        client = s3_client(endpoint, 1)
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"weed exited at start; see {work}/weed.log")
            try:
                client.create_bucket(Bucket=BUCKET)
                break
            except Exception as e:  # not up yet, or the bucket exists
                if "BucketAlreadyOwnedByYou" in str(e) or "BucketAlreadyExists" in str(e):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"weed not ready: {e}; see {work}/weed.log") from e
                time.sleep(0.3)
        yield endpoint
    finally:
        stop_group(proc)


class Daemon:
    """One ckptd with the store as its remote tier, in its own process group."""

    def __init__(
        self,
        binary: str,
        state: Path,
        endpoint: str,
        prefix: str,
        args: Any,
        staging_bytes: int,
        extra: list[str],
    ) -> None:
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir(parents=True)
        self.state = state
        self.sock = str(state / "ckptd.sock")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        argv = [
            binary,
            f"--state_dir={state}",
            f"--staging_bytes_max={staging_bytes}",
            "--log_level=warn",
            f"--remote_s3_endpoint={endpoint}",
            f"--remote_s3_bucket={BUCKET}",
            f"--remote_s3_prefix={prefix}",
            f"--remote_s3_part_size_bytes={args.part_mib * MiB}",
            f"--remote_s3_parts_in_flight={args.parts_in_flight}",
            "--tier_policy=local+remote",
            *extra,
        ]
        with open(state / "ckptd.log", "wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        for _ in range(600):
            if os.path.exists(self.sock):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ckptd did not start; see {state}/ckptd.log")

    def stop(self) -> None:
        stop_group(self.proc, 60)

    def data_dir(self, step: int) -> Path:
        return self.state / "data" / JOB / f"step-{step:020d}"


# --- the checkpoint ---------------------------------------------------------------------------
def make_tensors(gb: float, n: int, cols: int) -> dict[str, Any]:
    import numpy as np

    rows = max(12, int(gb * GiB / (n * cols * 4)) // 12 * 12)  # any 2/3/4-way row split
    rng = np.random.default_rng(7)
    return {
        f"layer{i:02d}.weight": rng.standard_normal((rows, cols), dtype=np.float32)
        for i in range(n)
    }


def row_block(rows: int, rank: int, world: int) -> tuple[int, int]:
    return rows * rank // world, rows * (rank + 1) // world


def save(sock: str, step: int, tensors: dict[str, Any]) -> None:
    """Saves `step` row-sharded over SAVE_RANKS ranks (one blob each); returns once
    COMMITTED."""
    import ckptd

    with ckptd.connect(sock, tier_policy="local+remote") as c:
        for rank in range(SAVE_RANKS):
            shards = {}
            for name, t in tensors.items():
                r0, r1 = row_block(t.shape[0], rank, SAVE_RANKS)
                box = ckptd.Box([r0, 0], [r1 - r0, t.shape[1]])
                shards[name] = ckptd.Shard(t[r0:r1], list(t.shape), box)
            c.save(JOB, step, shards, rank=rank, world_size=SAVE_RANKS)
        c.wait(JOB, step, timeout_ms=600_000)


def needed_aligned(tensors: dict[str, Any], box: tuple[int, int, int, int]) -> tuple[int, int]:
    """(needed, needed with each contiguous range rounded out to 4 KiB) for a box (r0, nrows, c0,
    ncols) of every tensor, from the saved layout: each rank's row block is one row-major run
    starting 4 KiB-aligned in its blob (docs/BLOB_FORMAT.md)."""
    r0, nr, c0, nc = box
    raw = aligned = 0
    for t in tensors.values():
        rows, cols = t.shape
        row_bytes = cols * 4
        for rank in range(SAVE_RANKS):
            s0, s1 = row_block(rows, rank, SAVE_RANKS)
            a, b = max(r0, s0), min(r0 + nr, s1)
            if a >= b:
                continue
            shard_len = (s1 - s0) * row_bytes
            if nc == cols:  # whole rows: one run
                runs = [((a - s0) * row_bytes, (b - a) * row_bytes)]
            else:
                runs = [((r - s0) * row_bytes + c0 * 4, nc * 4) for r in range(a, b)]
            end_prev = 0
            for off, n in runs:
                raw += n
                lo = off // ALIGN * ALIGN
                hi = min(-(-(off + n) // ALIGN) * ALIGN, max(shard_len, off + n))
                lo = max(lo, end_prev)
                aligned += max(0, hi - lo)
                end_prev = max(end_prev, hi)
    return raw, aligned


# --- the measurements -------------------------------------------------------------------------
def disk_read(files: list[Path], block: int) -> float:
    drop_file_caches(files)
    t0 = time.perf_counter()
    for f in files:
        subprocess.run(
            ["dd", f"if={f}", "of=/dev/null", f"bs={block}", "iflag=direct"],
            check=True,
            capture_output=True,
        )
    return time.perf_counter() - t0


def transfer_config(args: Any) -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=args.part_mib * MiB,
        multipart_chunksize=args.part_mib * MiB,
        max_concurrency=args.parts_in_flight,
        use_threads=True,
    )


def s3t_upload(client: Any, args: Any, files: list[Path], prefix: str) -> float:
    from s3transfer.manager import TransferManager

    drop_file_caches(files)
    t0 = time.perf_counter()
    with TransferManager(client, transfer_config(args)) as tm:
        futures = [tm.upload(str(f), BUCKET, f"{prefix}/{f.name}") for f in files]
        for fut in futures:
            fut.result()
    return time.perf_counter() - t0


def s3t_download(client: Any, args: Any, keys: list[str], dest: Path) -> float:
    from s3transfer.manager import TransferManager

    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with TransferManager(client, transfer_config(args)) as tm:
        futures = [tm.download(BUCKET, k, str(dest / Path(k).name)) for k in keys]
        for fut in futures:
            fut.result()
    elapsed = time.perf_counter() - t0
    shutil.rmtree(dest)
    return elapsed


def ckptd_upload(d: Daemon, step: int, tensors: dict[str, Any]) -> tuple[float, int, dict]:
    """(seconds from COMMITTED to durable on the store, upload bytes_total, upload status and
    the CPU seconds of the daemon and of the store meanwhile)."""
    import ckptd

    save(d.sock, step, tensors)
    cpu = cpu_now(d.proc.pid)
    t0 = time.perf_counter()
    with ckptd.connect(d.sock) as c:
        st = c.wait(JOB, step, until="remote", timeout_ms=600_000)
    elapsed = time.perf_counter() - t0
    up = dict(st.get("tiers", {}).get("upload", st.get("upload", {})))
    return elapsed, int(up.get("bytes_total", 0)), up | cpu_since(cpu, d.proc.pid)


def stored_bytes(client: Any, prefix: str, step: int) -> int:
    """Bytes of the blob objects of `step` under `prefix` on the store (the manifest not
    counted)."""
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/{JOB}/step-{step:020d}/")
    return sum(int(o["Size"]) for o in listed.get("Contents", []) if o["Key"].endswith(".blob"))


def delete_step(d: Daemon, step: int) -> None:
    import ckptd

    with ckptd.connect(d.sock) as c:
        c.delete(JOB, step)


# --- the run ----------------------------------------------------------------------------------
class Rows:
    def __init__(self, path: Path, common: dict[str, Any]) -> None:
        self.path = path
        self.common = common
        self.rows: list[dict[str, Any]] = []
        path.write_text("")

    def add(self, **row: Any) -> None:
        row = {**self.common, **row}
        if "bytes" in row and "seconds" in row and row["seconds"] > 0:
            row["gbps"] = row["bytes"] / row["seconds"] / GB
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        shown = {k: v for k, v in row.items() if k not in self.common}
        print("  " + json.dumps(shown), flush=True)


def rotate(xs: list[Any], r: int) -> list[Any]:
    return xs[r % len(xs) :] + xs[: r % len(xs)]


def run(args: Any) -> list[dict[str, Any]]:
    import numpy as np

    work = Path(args.work_dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    tensors = make_tensors(args.gb, args.tensors, args.cols)
    total = sum(t.nbytes for t in tensors.values())
    staging = (total + total // 4 + 64 * MiB + ALIGN - 1) // ALIGN * ALIGN
    part = args.part_mib * MiB
    common = {
        "checkpoint_bytes": total,
        "tensors": args.tensors,
        "part_bytes": part,
        "parts_in_flight": args.parts_in_flight,
    }
    out = Rows(Path(args.out) / "remote.jsonl", common)
    print(
        f"remote bench: {total / GiB:.2f} GiB in {args.tensors} tensors, part {args.part_mib} "
        f"MiB x {args.parts_in_flight} in flight, {args.rounds} rounds",
        flush=True,
    )
    with weed_server(args.weed, work / "weed") as endpoint:
        fair, signed = s3_client(endpoint, args.parts_in_flight), None
        if "s3transfer_signed" in args.systems:
            signed = s3_client(endpoint, args.parts_in_flight, signed=True)
        daemons: dict[str, Daemon] = {}
        try:
            daemons["ckptd"] = Daemon(
                args.daemon, work / "ckptd", endpoint, "default", args, staging, []
            )
            if "ckptd_zstd" in args.systems:
                daemons["ckptd_zstd"] = Daemon(
                    args.daemon,
                    work / "ckptd_zstd",
                    endpoint,
                    "zstd",
                    args,
                    staging,
                    ["--remote_codec=zstd"],
                )
            # The blob files s3transfer and dd read: a copy of a daemon's own files of the same
            # bytes (its upload is cancelled by the delete).
            save(daemons["ckptd"].sock, 1, tensors)
            files_dir = work / "blobs"
            shutil.copytree(daemons["ckptd"].data_dir(1), files_dir)
            files = sorted(f for f in files_dir.iterdir() if f.name != MANIFEST)
            blob_bytes = sum(f.stat().st_size for f in files)
            delete_step(daemons["ckptd"], 1)
            dests = {n: np.zeros_like(t) for n, t in tensors.items()}  # pre-faulted
            for r in range(args.rounds):
                step = 2 + r
                print(f"round {r + 1}/{args.rounds}", flush=True)
                one_round(
                    args,
                    out,
                    r,
                    step,
                    tensors,
                    daemons,
                    endpoint,
                    fair,
                    signed,
                    files,
                    blob_bytes,
                    dests,
                    work,
                )
                for d in daemons.values():
                    delete_step(d, step)
        finally:
            for d in daemons.values():
                d.stop()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return out.rows


def one_round(
    args: Any,
    out: Rows,
    r: int,
    step: int,
    tensors: dict[str, Any],
    daemons: dict[str, Daemon],
    endpoint: str,
    fair: Any,
    signed: Any,
    files: list[Path],
    blob_bytes: int,
    dests: dict[str, Any],
    work: Path,
) -> None:
    import numpy as np

    import ckptd

    part = args.part_mib * MiB
    uploads: dict[str, Callable[[], None]] = {}

    def up_ckptd(name: str) -> Callable[[], None]:
        def go() -> None:
            s, n, st = ckptd_upload(daemons[name], step, tensors)
            cpu = {k: v for k, v in st.items() if k.startswith("cpu_")}
            prefix = "zstd" if name == "ckptd_zstd" else "default"
            out.add(
                part="upload",
                system=name,
                round=r,
                bytes=n,
                seconds=s,
                state=st.get("state"),
                stored_bytes=stored_bytes(fair, prefix, step),
                **cpu,
            )

        return go

    def up_s3t(name: str, client: Any) -> Callable[[], None]:
        def go() -> None:
            cpu = cpu_now(None)
            s = s3t_upload(client, args, files, f"{name}/r{r}")
            out.add(
                part="upload",
                system=name,
                round=r,
                bytes=blob_bytes,
                seconds=s,
                **cpu_since(cpu, None),
            )

        return go

    def up_disk() -> None:
        s = disk_read(files, part)
        out.add(part="upload", system="disk_read", round=r, bytes=blob_bytes, seconds=s)

    uploads["ckptd"] = up_ckptd("ckptd")
    if "ckptd_zstd" in daemons:
        uploads["ckptd_zstd"] = up_ckptd("ckptd_zstd")
    uploads["s3transfer"] = up_s3t("s3transfer", fair)
    if signed is not None:
        uploads["s3transfer_signed"] = up_s3t("s3transfer_signed", signed)
    uploads["disk_read"] = up_disk
    for name in rotate([n for n in uploads if n in args.systems or n == "ckptd"], r):
        uploads[name]()

    # A fresh node: empty state dir, the bucket and prefix of `ckptd`; it adopts `step`.
    fresh = Daemon(args.daemon, work / "fresh", endpoint, "default", args, 512 * MiB, [])
    try:
        keys = [
            o["Key"]
            for o in fair.list_objects_v2(
                Bucket=BUCKET, Prefix=f"default/{JOB}/step-{step:020d}/"
            ).get("Contents", [])
            if not o["Key"].endswith(MANIFEST)
        ]
        with ckptd.connect(fresh.sock, rpc_timeout_ms=600_000) as c:

            def dl_ckptd() -> None:
                cpu = cpu_now(fresh.proc.pid)
                t0 = time.perf_counter()
                res = c.load(JOB, step, into=dests)
                s = time.perf_counter() - t0
                out.add(
                    part="download",
                    system="ckptd",
                    round=r,
                    bytes=res.bytes_read,
                    bytes_read_remote=res.bytes_read_remote,
                    seconds=s,
                    **cpu_since(cpu, fresh.proc.pid),
                )
                if r == 0:
                    for n, t in tensors.items():
                        if not np.array_equal(dests[n], t):
                            raise RuntimeError(f"loaded {n} differs from the saved tensor")
                for d in dests.values():
                    d.fill(0)

            def dl_s3t() -> None:
                cpu = cpu_now(None)
                s = s3t_download(fair, args, keys, work / "dl")
                out.add(
                    part="download",
                    system="s3transfer",
                    round=r,
                    bytes=blob_bytes,
                    seconds=s,
                    **cpu_since(cpu, None),
                )

            for fn in rotate([dl_ckptd, dl_s3t], r):
                fn()
            reshard(out, r, c, step, tensors, args, fair, keys[0])
    finally:
        fresh.stop()
    if "ckptd_zstd" in daemons:
        download_encoded(out, r, step, tensors, dests, args, endpoint, work)
    for name in ("s3transfer", "s3transfer_signed"):
        listed = fair.list_objects_v2(Bucket=BUCKET, Prefix=f"{name}/r{r}/").get("Contents", [])
        for o in listed:
            fair.delete_object(Bucket=BUCKET, Key=o["Key"])


def download_encoded(
    out: Rows,
    r: int,
    step: int,
    tensors: dict[str, Any],
    dests: dict[str, Any],
    args: Any,
    endpoint: str,
    work: Path,
) -> None:
    """A fresh daemon on the prefix of `ckptd_zstd` adopts `step` and loads it whole (every blob
    decoded); bit-exact checked in round 0."""
    import numpy as np

    import ckptd

    fresh = Daemon(args.daemon, work / "fresh_zstd", endpoint, "zstd", args, 512 * MiB, [])
    try:
        with ckptd.connect(fresh.sock, rpc_timeout_ms=600_000) as c:
            cpu = cpu_now(fresh.proc.pid)
            t0 = time.perf_counter()
            res = c.load(JOB, step, into=dests)
            s = time.perf_counter() - t0
            out.add(
                part="download",
                system="ckptd_zstd",
                round=r,
                bytes=res.bytes_read,
                bytes_read_remote=res.bytes_read_remote,
                seconds=s,
                **cpu_since(cpu, fresh.proc.pid),
            )
            if r == 0:
                for n, t in tensors.items():
                    if not np.array_equal(dests[n], t):
                        raise RuntimeError(f"{n} loaded from the encoded copy differs")
            for d in dests.values():
                d.fill(0)
    finally:
        fresh.stop()


def reshard(
    out: Rows,
    r: int,
    c: Any,
    step: int,
    tensors: dict[str, Any],
    args: Any,
    client: Any,
    blob_key: str,
) -> None:
    """Resharded loads from the store. The column slices are taken from the first tensor over
    its first --reshard-rows rows only: every row of a column slice is its own byte run, so
    its own ranged GET (a whole 1 GiB checkpoint would be 65536 GETs). `boto3_get` issues the
    same number of ranged GETs of the same sizes and stride in the same blob with
    parts_in_flight threads: the store's small-GET rate beside ckptd's."""
    import numpy as np

    import ckptd

    first = next(iter(tensors))
    rows, cols = tensors[first].shape
    tile = min(rows // SAVE_RANKS, args.reshard_rows)
    layouts = {  # name: (tensors, (row0, nrows, col0, ncols))
        "cols_4way_rank1": ([first], (0, tile, cols // 4, cols // 4)),
        "cols_3way_rank1": ([first], (0, tile, cols // 3, cols // 3)),
        "rows_3way_rank1": (list(tensors), (rows // 3, rows // 3, 0, cols)),
    }
    for layout, (names, (r0, nr, c0, nc)) in layouts.items():
        into = {n: (np.empty((nr, nc), np.float32), ckptd.Box([r0, c0], [nr, nc])) for n in names}
        t0 = time.perf_counter()
        res = c.load(JOB, step, into=into)
        s = time.perf_counter() - t0
        raw, aligned = needed_aligned({n: tensors[n] for n in names}, (r0, nr, c0, nc))
        if r == 0:
            for n, (dest, _) in into.items():
                if not np.array_equal(dest, tensors[n][r0 : r0 + nr, c0 : c0 + nc]):
                    raise RuntimeError(f"resharded {n} ({layout}) differs from the saved tensor")
        runs = nr if nc < cols else 1
        out.add(
            part="reshard",
            system="ckptd",
            layout=layout,
            round=r,
            bytes=res.bytes_read,
            bytes_read_remote=res.bytes_read_remote,
            bytes_needed=raw,
            bytes_needed_aligned=aligned,
            runs=runs,
            seconds=s,
        )
        if layout == "cols_4way_rank1":
            n_get = aligned // runs
            ranges = [(i * cols * 4 + c0 * 4, n_get) for i in range(r0, r0 + nr)]
            s = ranged_gets(client, blob_key, ranges, args.parts_in_flight)
            out.add(
                part="reshard",
                system="boto3_get",
                layout=layout,
                round=r,
                bytes=aligned,
                bytes_needed=raw,
                bytes_needed_aligned=aligned,
                runs=runs,
                seconds=s,
            )


def ranged_gets(client: Any, key: str, ranges: list[tuple[int, int]], threads: int) -> float:
    from concurrent.futures import ThreadPoolExecutor

    def get(rng: tuple[int, int]) -> int:
        off, n = rng
        body = client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={off}-{off + n - 1}")
        return len(body["Body"].read())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        got = sum(pool.map(get, ranges))
    elapsed = time.perf_counter() - t0
    if got != sum(n for _, n in ranges):
        raise RuntimeError(f"ranged GETs of {key}: {got} bytes")
    return elapsed


# --- the table --------------------------------------------------------------------------------
def table(rows: list[dict[str, Any]]) -> None:
    """Medians per (part, system) and the ratios the issue asks for, as markdown."""
    if not rows:
        return
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["part"] != "reshard":
            by[(row["part"], row["system"])].append(row)

    def med(part: str, system: str) -> float | None:
        rs = by.get((part, system))
        return statistics.median(x["gbps"] for x in rs) if rs else None

    n = len({row["round"] for row in rows})
    print(
        f"\n| part | system | median GB/s ({n} rounds) | / s3transfer | / disk read "
        "| client CPU s/GB | store CPU s/GB |"
    )
    print("|---|---|---|---|---|---|---|")
    disk = med("upload", "disk_read")
    for part, system in sorted(by):
        g, base = med(part, system), med(part, "s3transfer")
        assert g is not None
        vs = f"{g / base:.2f}" if base else "-"
        vd = f"{g / disk:.2f}" if disk and part == "upload" else "-"
        rs = by[(part, system)]
        cpu = [
            f"{statistics.median(x[k] / (x['bytes'] / GB) for x in rs):.2f}" if k in rs[0] else "-"
            for k in ("cpu_client_s", "cpu_store_s")
        ]
        print(f"| {part} | {system} | {g:.3f} | {vs} | {vd} | {cpu[0]} | {cpu[1]} |")
    ups = {
        sys_: rs for (part, sys_), rs in by.items() if part == "upload" and "stored_bytes" in rs[0]
    }
    if "ckptd" in ups and "ckptd_zstd" in ups:
        raw = statistics.median(x["stored_bytes"] for x in ups["ckptd"])
        print("\n| system | bytes on the store | raw / stored | median upload s | / ckptd |")
        print("|---|---|---|---|---|")
        base = statistics.median(x["seconds"] for x in ups["ckptd"])
        for sys_ in ("ckptd", "ckptd_zstd"):
            st = statistics.median(x["stored_bytes"] for x in ups[sys_])
            sec = statistics.median(x["seconds"] for x in ups[sys_])
            print(f"| {sys_} | {st:.0f} | {raw / st:.3f} | {sec:.2f} | {base / sec:.2f} |")
    re: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["part"] == "reshard":
            re[(row["layout"], row["system"])].append(row)
    print(
        "\n| reshard layout | system | byte runs | bytes read | needed (4 KiB-rounded) "
        "| read / needed | median s | runs/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (layout, system), rs in sorted(re.items()):
        read, need = rs[0]["bytes"], rs[0]["bytes_needed_aligned"]
        s = statistics.median(x["seconds"] for x in rs)
        print(
            f"| {layout} | {system} | {rs[0]['runs']} | {read} | {need} | {read / need:.3f} "
            f"| {s:.2f} | {rs[0]['runs'] / s:.0f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--daemon", default=str(ROOT / "build" / "ckptd"))
    ap.add_argument("--weed", default=shutil.which("weed") or "weed")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--work-dir", default=str(ROOT / "bench" / "state-remote"))
    ap.add_argument("--gb", type=float, default=1.0, help="checkpoint GiB (float32)")
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--part-mib", type=int, default=8)
    ap.add_argument("--parts-in-flight", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reshard-rows", type=int, default=1024, help="rows of the column slices")
    ap.add_argument(
        "--systems",
        default="ckptd,s3transfer,disk_read",
        help="also: s3transfer_signed (boto3's default config over http), ckptd_zstd (a daemon "
        "with remote_codec=zstd)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs, store)")
    ap.add_argument("--table", metavar="JSONL", help="only print the table of a results file")
    args = ap.parse_args()
    if args.table:
        path = Path(args.table)
        table([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
        return
    args.systems = args.systems.split(",")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    rows = run(args)
    table(rows)
    print(f"\nremote bench: {time.monotonic() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
