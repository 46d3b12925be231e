"""checkpoint_id -> (job, step): a DCP checkpoint id is treated like a path.

"ckptd://runs/llama/step-100", "/runs/llama/step-100" and "runs/llama/step-100" all name job
"runs.llama", step 100. Rules: a leading "ckptd://" or "/" is dropped; empty, "." and ".."
components are refused; the parent path is the job, encoded to satisfy the daemon's job-name rules
([A-Za-z0-9._-], 1..128 bytes, no leading '.', no ".."); a trailing integer of the last component
is the step. Without one (e.g. "runs/llama/final") the writer takes the next free step and records
the name in the checkpoint (object item NAME_ITEM), and the reader looks the name up.

Job encoding (reversible): '/' -> '.', '.' -> "_d", '_' -> "__", any other byte outside
[A-Za-z0-9-] -> '_' + two upper-case hex digits.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

PREFIX = "ckptd://"
NAME_ITEM = "__ckptd__/checkpoint_name"
PLANNER_DATA_ITEM = "__ckptd__/dcp_planner_data"
# A planless save's rank r > 0: the flattening mappings of the items it wrote (rank 0 saves its
# own, all of them, as PLANNER_DATA_ITEM), so a template-less load nests items rank 0 lacks.
RANK_MAPPINGS_PREFIX = "__ckptd__/dcp_planner_data.rank"
DCP_CHUNKS_ITEM = "__ckptd__/dcp_chunks"  # a rank-local part's chunks: {fqn: [(offsets, sizes)]}
RESERVED_PREFIX = "__ckptd__/"


def rank_mappings_item(rank: int) -> str:
    """The object item holding planless rank `rank`'s own flattening mappings."""
    return f"{RANK_MAPPINGS_PREFIX}{int(rank)}"


JOB_BYTES_MAX = 128
STEP_MAX = 1 << 62
_TRAILING_INT = re.compile(r"(\d+)$")
_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")


@dataclass(frozen=True)
class CheckpointId:
    raw: str = field(compare=False)  # equal ids name the same checkpoint
    job: str = ""
    name: str = ""  # the last component
    step: int | None = None  # None: assigned at save / looked up by name at load


def encode_job(path: str) -> str:
    out = []
    for component in path.split("/"):
        enc = []
        for byte in component.encode("utf-8"):
            if byte in _PLAIN:
                enc.append(chr(byte))
            elif byte == ord("."):
                enc.append("_d")
            elif byte == ord("_"):
                enc.append("__")
            else:
                enc.append(f"_{byte:02X}")
        out.append("".join(enc))
    return ".".join(out)


def decode_job(job: str) -> str:
    out = bytearray()
    i = 0
    while i < len(job):
        c = job[i]
        if c == ".":
            out += b"/"
        elif c == "_":
            nxt = job[i + 1 : i + 2]
            if nxt == "_":
                out += b"_"
            elif nxt == "d":
                out += b"."
            else:
                out.append(int(job[i + 1 : i + 3], 16))
                i += 1
            i += 1
        else:
            out += c.encode()
        i += 1
    return out.decode("utf-8")


def parse(checkpoint_id: str | os.PathLike[str]) -> CheckpointId:
    """ValueError naming the rule when the id is not a valid ckptd checkpoint id."""
    raw = os.fspath(checkpoint_id)
    if not isinstance(raw, str):
        raise ValueError(f"checkpoint_id must be a str or path, not {type(raw).__name__}")
    path = raw[len(PREFIX) :] if raw.startswith(PREFIX) else raw
    path = path[1:] if path.startswith("/") else path
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError(
                f"checkpoint_id {raw!r}: empty, '.' and '..' path components are refused"
            )
    if len(parts) < 2:
        raise ValueError(
            f"checkpoint_id {raw!r}: want <job path>/<name>, e.g. 'runs/llama/step-100'"
        )
    job = encode_job("/".join(parts[:-1]))
    if len(job.encode()) > JOB_BYTES_MAX:
        raise ValueError(
            f"checkpoint_id {raw!r}: the job {job!r} is {len(job)} bytes encoded; "
            f"the limit is {JOB_BYTES_MAX}"
        )
    name = parts[-1]
    m = _TRAILING_INT.search(name)
    step = int(m.group(1)) if m else None
    if step is not None and step >= STEP_MAX:
        raise ValueError(f"checkpoint_id {raw!r}: step {step} is not below 2^62")
    return CheckpointId(raw=raw, job=job, name=name, step=step)


PART_JOB_MARK = "._rank"  # never produced by encode_job: '_' is followed by '_', 'd' or hex there


def part_job(job: str, rank: int) -> str:
    """The job holding rank `rank`'s rank-local part of a checkpoint of `job` (DCP's
    use_collectives=False): a checkpoint of its own (rank 0 of 1), committed on its own."""
    out = f"{job}{PART_JOB_MARK}{int(rank)}"
    if len(out.encode()) > JOB_BYTES_MAX:
        raise ValueError(
            f"job {job!r}: its rank-local part job {out!r} is {len(out)} bytes; the limit is "
            f"{JOB_BYTES_MAX} (use a shorter checkpoint_id path with use_collectives=False)"
        )
    return out


def part_rank(job: str, candidate: str) -> int | None:
    """The rank whose rank-local part of `job` the job `candidate` holds, else None."""
    prefix = f"{job}{PART_JOB_MARK}"
    tail = candidate[len(prefix) :] if candidate.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None
