"""Imports from the checkpoint formats users already have, and exports back.

    import ckptd, ckptd.formats as fmt
    client = ckptd.connect()
    source = fmt.open_source("safetensors", "./llama-8b")  # dcp|deepspeed|safetensors|torch
    result = fmt.import_source(client, "llama", 0, source)  # an ordinary ckptd checkpoint
    fmt.export_dcp(client, "llama", 0, "./llama-dcp", chunk_bytes=1 << 30)

Every format is read with its own safe reader (the safetensors library, torch.load with
weights_only=True — for DeepSpeed's ZeRO files with an allowlist of the four DeepSpeed globals they
pickle, bound to stand-ins, DeepSpeed not imported — DCP's FileSystemReader with an allowlisted
`.metadata` unpickler); a DeepSpeed checkpoint is written in ckptd.deepspeed's convention
(fp32/, optim/, frozen/, buffer/ items and a `deepspeed` JSON object), one part per DP rank.
Input that cannot be read safely or is malformed raises RefusedInputError naming the file. The
command line is `ckptd-import` / `ckptd-export` (or `python3 -m ckptd import|export`; see
ckptd/_cli.py).
torch is needed (and safetensors for that format); ckptd itself does not import this package."""

from __future__ import annotations

from typing import Any

from ._common import RefusedInputError, Source, UsageError
from ._importer import FORMATS, ImportResult, batch_limit, open_source, run_import
from ._progress import Progress, human_bytes, parse_size

__all__ = [
    "FORMATS",
    "ImportResult",
    "Progress",
    "RefusedInputError",
    "Source",
    "UsageError",
    "batch_limit",
    "export_dcp",
    "human_bytes",
    "import_source",
    "open_source",
    "parse_size",
]

DEFAULT_BATCH_BYTES = 1 << 30


def import_source(
    client: Any,
    job: str,
    step: int,
    source: Source,
    *,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    quiet: bool = True,
) -> ImportResult:
    """Saves `source` as checkpoint job/step in batches of at most batch_bytes (and half the
    staging arena) and waits until it is COMMITTED. quiet=False draws progress on stderr."""
    limit = batch_limit(client, batch_bytes)
    label = f"import {source.format}"
    return run_import(
        client, job, step, source, limit, lambda total: Progress(label, total, quiet=quiet)
    )


def export_dcp(client: Any, job: str, step: int, directory: Any, **kwargs: Any) -> Any:
    """See ckptd.formats._dcp_export.export_dcp (imports torch)."""
    from ._dcp_export import export_dcp as export

    return export(client, job, step, directory, **kwargs)
