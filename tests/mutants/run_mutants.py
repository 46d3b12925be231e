#!/usr/bin/env python3
"""make mutants: plants, one at a time, the bugs that matter and checks the tests catch each.

Each mutant (MUTANTS below) is a small edit of the daemon's source that breaks one invariant the
design rests on: a checksum never compared, the COMMITTED row written before the manifest, a
commit one rank short, a lease ignored, an owner check skipped, an upload marked durable before
its manifest. For each: apply the edit to a copy of the tree, rebuild what the tests need, run the
tests that should catch it, and put the source back. A mutant whose tests all pass SURVIVED: the
run fails, naming it and the tests that missed it.

The working tree is never edited: the tree (tracked and untracked-not-ignored files, as they are
now) is copied to $MUTANTS_DIR/src (default build-mutants/src; unchanged files keep their times,
so a second run rebuilds only what changed) and built in $MUTANTS_DIR/build (-O1, no debug
info: compile time is what a mutant costs). Before any mutant, the unmutated copy must pass every
test the mutants use (else a "kill" could be a flaky test). A test run past its timeout counts as
a kill (a mutant that hangs the daemon is caught), and is reported as such.

An edit whose text is not found (the code moved) fails the run at once with the file and text:
update the mutant here, next to the code it now plants into.

Usage: tests/mutants/run_mutants.py [--only NAME[,NAME]] [--rev COMMIT] [--list] [--jobs N]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Edit:
    path: str  # relative to the tree
    old: str  # must occur exactly `count` times
    new: str
    count: int = 1


@dataclasses.dataclass(frozen=True)
class Check:
    binary: str  # under the build dir
    spec: str  # Catch test spec (name, wildcard or [tag])


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    invariant: str
    edits: tuple[Edit, ...]
    checks: tuple[Check, ...]


UNIT_FORMAT = "tests/ckptd_unit_format"
UNIT_DATAPLANE = "tests/ckptd_unit_dataplane"
UNIT_SERVICE = "tests/ckptd_unit_service"
INTEGRATION = "tests/ckptd_integration_tests"
UNIT_CLIENT = "tests/ckptd_unit_client"

MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="checksum-never-compared",
        invariant="every byte read back is checked against its block's crc32c (VerifyBlocks)",
        edits=(
            Edit(
                "daemon/src/format/crc32c.cc",
                "if (actual[i] != crcs[block]) {",
                "if (false && actual[i] != crcs[block]) {",
            ),
        ),
        checks=(
            Check(UNIT_FORMAT, "VerifyBlocks checks whole blocks of a shard"),
            Check(INTEGRATION, "[verify]"),
        ),
    ),
    Mutant(
        name="committed-before-manifest",
        invariant="the manifest is durable before the COMMITTED row that points at it",
        edits=(
            Edit(
                "daemon/src/service/commit.cc",
                "  CKPTD_RETURN_IF_ERROR(\n"
                '      BlobTier(policy)->PutAtomic(absl::StrCat(dir, "/", kManifestFileName),'
                " bytes));\n"
                '  CKPTD_SYNC_POINT("commit.manifest_durable");\n',
                "",
            ),
            Edit(
                "daemon/src/service/commit.cc",
                '  CKPTD_SYNC_POINT("commit.indexed");\n  return absl::OkStatus();\n',
                '  CKPTD_SYNC_POINT("commit.indexed");\n'
                "  CKPTD_RETURN_IF_ERROR(\n"
                '      BlobTier(policy)->PutAtomic(absl::StrCat(dir, "/", kManifestFileName),'
                " bytes));\n"
                '  CKPTD_SYNC_POINT("commit.manifest_durable");\n'
                "  return absl::OkStatus();\n",
            ),
        ),
        checks=(
            Check(UNIT_SERVICE, "power-loss matrix*"),
            Check(INTEGRATION, "[crash-matrix]"),
        ),
    ),
    Mutant(
        name="commit-one-rank-short",
        invariant="a checkpoint commits only once every expected rank is staged and persisted",
        edits=(
            Edit(
                "daemon/src/service/pending_checkpoint.cc",
                "if (!partial && ranks.size() < expected_ranks()) return false;",
                "if (!partial && ranks.size() + 1 < expected_ranks()) return false;",
            ),
            Edit(
                "daemon/src/service/pending_checkpoint.cc",
                "if (ranks.size() == expected_ranks())",
                "if (ranks.size() + 1 >= expected_ranks())",
            ),
        ),
        checks=(
            Check(UNIT_SERVICE, "lifecycle*"),
            # Catch: a comma is "or".
            Check(
                INTEGRATION,
                "spanning nodes: a late node holding only the highest rank*,"
                "Client::Wait on an aborted checkpoint says why*",
            ),
        ),
    ),
    Mutant(
        name="lease-ignored",
        invariant="an extent in use (leased) is never freed or re-issued until its lease ends",
        edits=(
            Edit(
                "daemon/src/dataplane/arena.cc",
                "void StagingArena::ReleaseLocked(absl::flat_hash_map<uint64_t, ExtentInfo>::"
                "iterator it) {\n  if (it->second.leases > 0) {",
                "void StagingArena::ReleaseLocked(absl::flat_hash_map<uint64_t, ExtentInfo>::"
                "iterator it) {\n  if (false && it->second.leases > 0) {",
            ),
        ),
        checks=(Check(UNIT_DATAPLANE, "[unit]"),),
    ),
    Mutant(
        name="owner-check-skipped",
        invariant="a uid loads only the jobs it owns (Load checks the job's owner)",
        edits=(
            Edit(
                "daemon/src/service/load.cc",
                "CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));",
                "CKPTD_RETURN_IF_ERROR(absl::OkStatus());",
                count=2,
            ),
        ),
        checks=(Check(INTEGRATION, "[tenancy]"),),
    ),
    Mutant(
        name="durable-before-manifest",
        invariant="an upload is marked DURABLE only after its manifest is on the store",
        edits=(
            Edit(
                "daemon/src/tier/remote_tier.cc",
                "  CKPTD_RETURN_IF_ERROR(CopyAll(u, u.dir, blobs));\n",
                "  {\n"
                "    v1::Upload early;\n"
                "    {\n"
                "      absl::MutexLock lock(&mu_);\n"
                "      early = u.state;\n"
                "    }\n"
                "    early.set_state(v1::UPLOAD_DURABLE);\n"
                "    CKPTD_RETURN_IF_ERROR(WriteRow(u, early));\n"
                "  }\n"
                "  CKPTD_RETURN_IF_ERROR(CopyAll(u, u.dir, blobs));\n",
            ),
        ),
        checks=(Check(INTEGRATION, "[crash-matrix]"),),
    ),
    Mutant(
        name="staged-before-copy",
        invariant="an overlapped save is staged (the caller may change its tensors) only after "
        "its copy",
        edits=(
            Edit(
                "client/cpp/src/async_saves.cc",
                "    absl::StatusOr<SaveResult> result = entry.save();\n",
                "    {\n"
                "      absl::MutexLock early(&entry.state->mu);\n"
                "      entry.state->result = SaveResult{};\n"
                "    }\n"
                "    absl::StatusOr<SaveResult> result = entry.save();\n",
            ),
        ),
        checks=(Check(UNIT_CLIENT, "SaveAsync returns before its copy*"),),
    ),
)

# What every mutant's checks need built (the integration tests start the daemon, ckptctl and the
# test client from the build dir).
TARGETS = (
    "ckptd",
    "ckptctl",
    "ckptd_testclient",
    "ckptd_integration_tests",
    "ckptd_unit_format",
    "ckptd_unit_dataplane",
    "ckptd_unit_service",
    "ckptd_unit_client",
)
CHECK_TIMEOUT_S = 900


def log(msg: str) -> None:
    print(f"[mutants {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tree_files(rev: str) -> dict[str, bytes]:
    """The files to copy: the working tree as it is now (tracked + untracked-not-ignored files),
    or those of commit `rev`."""
    if rev:
        names = (
            subprocess.run(
                ["git", "ls-tree", "-r", "-z", "--name-only", rev],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            .stdout.decode()
            .split("\0")
        )
        out = {}
        for n in filter(None, names):
            blob = subprocess.run(["git", "show", f"{rev}:{n}"], cwd=ROOT, capture_output=True)
            if blob.returncode == 0:  # a submodule entry has no blob
                out[n] = blob.stdout
        return out
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    return {f: (ROOT / f).read_bytes() for f in listed if f and (ROOT / f).is_file()}


def copy_tree(src_dir: Path, rev: str) -> None:
    """tree_files(rev) into src_dir. A file whose bytes are unchanged is left alone (its time
    too), so the copy's build redoes only what changed since the last run; files gone from the
    tree go from the copy."""
    wanted = tree_files(rev)
    for rel, data in wanted.items():
        dst = src_dir / rel
        if dst.is_file() and dst.read_bytes() == data:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)
        if (ROOT / rel).is_file():
            shutil.copymode(ROOT / rel, dst)
    for dst in src_dir.rglob("*"):
        if dst.is_file() and str(dst.relative_to(src_dir)) not in wanted:
            dst.unlink()


def configure(src_dir: Path, build_dir: Path) -> None:
    if (build_dir / "build.ninja").exists():
        return
    subprocess.run(
        [
            "cmake",
            "-S",
            str(src_dir),
            "-B",
            str(build_dir),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
            "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def build(build_dir: Path, jobs: int) -> None:
    r = subprocess.run(
        ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise BuildError((r.stdout + r.stderr)[-4000:])


class BuildError(Exception):
    """The build failed; the message is the end of its output."""


def run_check(build_dir: Path, check: Check) -> tuple[str, float]:
    """'pass', 'fail' or 'timeout', and the seconds it took."""
    start = time.monotonic()
    try:
        r = subprocess.run(
            [str(build_dir / check.binary), check.spec],
            cwd=build_dir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=CHECK_TIMEOUT_S,
            start_new_session=True,
        )
        outcome = "pass" if r.returncode == 0 else "fail"
    except subprocess.TimeoutExpired:
        outcome = "timeout"
    return outcome, time.monotonic() - start


def apply(src_dir: Path, m: Mutant) -> dict[Path, str]:
    """Applies m's edits; returns the originals to put back. Raises when an edit's text moved."""
    originals: dict[Path, str] = {}
    for e in m.edits:
        p = src_dir / e.path
        text = p.read_text()  # a second edit of one file sees the first's result
        originals.setdefault(p, text)
        found = text.count(e.old)
        if found != e.count:
            restore(originals)
            raise SystemExit(
                f"mutant {m.name}: {e.path} has {found} of the text to replace, not {e.count} "
                f"(the code moved: update tests/mutants/run_mutants.py):\n{e.old}"
            )
        p.write_text(text.replace(e.old, e.new))
    return originals


def restore(originals: dict[Path, str]) -> None:
    for p, text in originals.items():
        p.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated mutant names")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rev", default="", help="mutate this commit instead of the working tree")
    args = ap.parse_args()
    if args.list:
        for m in MUTANTS:
            print(f"{m.name}: {m.invariant}")
        return 0
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {m.name for m in MUTANTS}
    if unknown:
        print(f"unknown mutant(s): {', '.join(sorted(unknown))} (--list names them)")
        return 2
    base = Path(os.environ.get("MUTANTS_DIR", ROOT / "build-mutants"))
    src_dir, build_dir = base / "src", base / "build"
    log(f"copying {args.rev or 'the working tree'} to {src_dir}")
    copy_tree(src_dir, args.rev)
    configure(src_dir, build_dir)
    log("building the unmutated tree")
    try:
        build(build_dir, args.jobs)
    except BuildError as e:
        print(f"the unmutated tree does not build:\n{e}")
        return 2
    checks = sorted({c for m in chosen for c in m.checks}, key=lambda c: (c.binary, c.spec))
    for c in checks:
        outcome, secs = run_check(build_dir, c)
        log(f"baseline {c.binary} {c.spec!r}: {outcome} ({secs:.0f} s)")
        if outcome != "pass":
            print(f"the unmutated tree fails {c.binary} {c.spec!r}: fix that first")
            return 1
    survivors = []
    for m in chosen:
        originals = apply(src_dir, m)
        try:
            log(f"{m.name}: building")
            try:
                build(build_dir, args.jobs)
            except BuildError as e:
                print(f"mutant {m.name} does not compile (update run_mutants.py):\n{e}")
                return 2
            killed_by = []
            for c in m.checks:
                outcome, secs = run_check(build_dir, c)
                log(f"{m.name}: {c.binary} {c.spec!r}: {outcome} ({secs:.0f} s)")
                if outcome != "pass":
                    killed_by.append(f"{c.spec} ({outcome})")
            if killed_by:
                log(f"{m.name}: KILLED by {', '.join(killed_by)}")
            else:
                survivors.append(m)
                log(f"{m.name}: SURVIVED ({m.invariant})")
        finally:
            restore(originals)
    build(build_dir, args.jobs)  # leave the copy's build unmutated for the next run
    print(f"mutants: {len(chosen) - len(survivors)} of {len(chosen)} killed")
    for m in survivors:
        checks = "; ".join(f"{c.binary} {c.spec!r}" for c in m.checks)
        print(f"SURVIVED {m.name}: {m.invariant}; missed by {checks}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
