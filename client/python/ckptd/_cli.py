"""The command line of the Python package: imports from other checkpoint formats and exports.

    ckptd-import --format dcp|deepspeed|safetensors|torch JOB STEP PATH
    ckptd-export [--format dcp] JOB STEP|latest DIR
    python3 -m ckptd import ... | python3 -m ckptd export ...

The scripts are not called `ckptd`: that is the daemon's binary, and a console script of that name
in the Python environment's bin directory would shadow it on PATH.

Exit codes: 0 done; 1 a daemon or I/O error (no daemon, the checkpoint exists, a missing file);
2 a usage error; 3 refused input (unsafe or malformed: a pickle naming code, a truncated file,
a header that lies), with a message naming the file; 130 interrupted."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_INTERRUPTED = 130


def _size(text: str) -> int:
    from .formats import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _step(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a step (an integer >= 0)")
    return int(text)


def _step_or_latest(text: str) -> int | str:
    return text if text == "latest" else _step(text)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", help="the daemon's socket (default: $CKPTD_SOCKET or the default)")
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON document")


def _padded(text: str) -> tuple[str, int]:
    name, sep, rows = text.rpartition("=")
    if not sep or not name or not rows.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=ROWS (e.g. embed.weight=50257)")
    return name, int(rows)


def _import_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", required=True, choices=("dcp", "deepspeed", "safetensors", "torch"))
    p.add_argument(
        "--batch_bytes",
        type=_size,
        default=1 << 30,
        help="the most tensor bytes read and saved at once, one rank each (default 1GiB; at "
        "most half the daemon's staging arena)",
    )
    p.add_argument(
        "--padded",
        type=_padded,
        action="append",
        default=[],
        metavar="NAME=ROWS",
        help="deepspeed: parameter NAME is padded along dim 0 past ROWS logical rows (a "
        "vocabulary); stored without the padding, as ckptd.deepspeed saves Padded(0, ROWS) "
        "(repeatable)",
    )
    _common(p)
    p.add_argument("job")
    p.add_argument("step", type=_step)
    p.add_argument(
        "path",
        help="a DCP directory, a DeepSpeed checkpoint (its tag directory, or the directory whose "
        "`latest` names it), a .safetensors file / index / model directory, or a torch.save file "
        "/ index",
    )


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", default="dcp", choices=("dcp", "safetensors"))
    p.add_argument(
        "--chunk_bytes",
        type=_size,
        default=1 << 30,
        help="tensors are written in row blocks of at most this many bytes (default 1GiB)",
    )
    p.add_argument("--force", action="store_true", help="replace an earlier DCP export in DIR")
    _common(p)
    p.add_argument("job")
    p.add_argument("step", type=_step_or_latest, help="a step or 'latest'")
    p.add_argument("dir")


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _print_summary(args: argparse.Namespace, result: Any, text: str, notes: Sequence[str]) -> None:
    if args.json:
        print(json.dumps(dataclasses.asdict(result), sort_keys=True))
        return
    print(text)
    for note in notes:
        print(f"  note: {note}")


def _run_import(args: argparse.Namespace) -> int:
    import ckptd

    from . import formats
    from .formats import human_bytes as hb

    client = ckptd.connect(args.socket)
    source = formats.open_source(args.format, args.path, dict(args.padded))
    try:
        limit = formats.batch_limit(client, args.batch_bytes)
        label = f"import {args.format}"
        r = formats.run_import(
            client,
            args.job,
            args.step,
            source,
            limit,
            lambda total: formats.Progress(label, total, quiet=args.quiet),
        )
    finally:
        source.close()
    rate = hb(r.bytes / r.elapsed_s) + "/s" if r.elapsed_s > 0 else "-"
    _print_summary(
        args,
        r,
        f"imported {r.format} {r.path} as {r.job}/{r.step}: {_n(r.tensors, 'tensor')}, "
        f"{_n(r.objects, 'object')}, {hb(r.bytes)} in {_n(r.world_size, 'rank')} of at most "
        f"{hb(r.batch_bytes)} ({r.elapsed_s:.1f}s, {rate}); COMMITTED",
        r.notes,
    )
    return EXIT_OK


def _run_export(args: argparse.Namespace) -> int:
    import ckptd

    from . import formats
    from .formats import human_bytes as hb

    if args.format == "safetensors":
        print(
            "ckptd-export: safetensors exports are ckptctl's: "
            "ckptctl export --format safetensors JOB STEP DIR",
            file=sys.stderr,
        )
        return EXIT_USAGE
    client = ckptd.connect(args.socket)
    step = args.step
    if step == "latest":
        step = client.latest(args.job)
        if step is None:
            raise ckptd.NotFoundError(f"job {args.job} has no committed checkpoint")
    r = formats.export_dcp(
        client,
        args.job,
        step,
        args.dir,
        chunk_bytes=args.chunk_bytes,
        force=args.force,
        progress=lambda total: formats.Progress("export dcp", total, quiet=args.quiet),
    )
    _print_summary(
        args,
        r,
        f"exported {r.job}/{r.step} to {r.directory} as DCP: {_n(r.tensors, 'tensor')}, "
        f"{_n(r.objects, 'object')}, {hb(r.bytes)} in {_n(r.files, 'file')} ({r.elapsed_s:.1f}s)",
        [f"object not exported: {s}" for s in r.skipped],
    )
    return EXIT_OK


def _guarded(prog: str, run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """run(args), mapping failures to the exit codes of the module docstring."""
    import ckptd

    from .formats import RefusedInputError, UsageError

    def fail(code: int, message: object) -> int:
        print(f"{prog}: {message}", file=sys.stderr)
        return code

    try:
        return run(args)
    except RefusedInputError as e:
        return fail(EXIT_REFUSED, f"refused: {e}")
    except UsageError as e:
        return fail(EXIT_USAGE, e)
    except (ckptd.CkptdError, OSError) as e:
        return fail(EXIT_ERROR, e)
    except ImportError as e:
        return fail(EXIT_ERROR, f"{e} (this command needs it: pip install {e.name or 'it'})")
    except KeyboardInterrupt:
        return fail(EXIT_INTERRUPTED, "interrupted")


def import_main(argv: Sequence[str] | None = None) -> int:
    """The ckptd-import console script."""
    p = argparse.ArgumentParser(
        prog="ckptd-import",
        description="Import a DCP directory, DeepSpeed ZeRO checkpoint, safetensors model or "
        "torch.save state dict as checkpoint JOB/STEP of the local ckptd.",
    )
    _import_args(p)
    return _guarded(p.prog, _run_import, p.parse_args(argv))


def export_main(argv: Sequence[str] | None = None) -> int:
    """The ckptd-export console script."""
    p = argparse.ArgumentParser(
        prog="ckptd-export",
        description="Export checkpoint JOB/STEP as a PyTorch DCP directory (FileSystemReader).",
    )
    _export_args(p)
    return _guarded(p.prog, _run_export, p.parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """python3 -m ckptd import|export ..."""
    p = argparse.ArgumentParser(prog="python3 -m ckptd", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    _import_args(sub.add_parser("import", help="import another format as a checkpoint"))
    _export_args(sub.add_parser("export", help="export a checkpoint as a DCP directory"))
    args = p.parse_args(argv)
    run = _run_import if args.command == "import" else _run_export
    return _guarded(f"{p.prog} {args.command}", run, args)
