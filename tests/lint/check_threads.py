#!/usr/bin/env python3
"""The thread-safety analysis of the sources clang-tidy does not lint (make check-threads).

Usage: check_threads.py BUILD_TSA TIDY_REGEX JOBS

build-tsa/'s compile commands carry clang-15's -Wthread-safety -Werror (CKPTD_THREAD_SAFETY), so
`make tidy`, which parses the daemon, the client (the Python binding included) and the storage
plugins with those commands, already fails on every lock-annotation finding in them (as
clang-diagnostic-thread-safety-*). This checks the rest (the tests, whose rigs hold locks too, and
the benchmarks): every other translation unit of the compile database is parsed with the same
command and -fsyntax-only (the analysis needs no code generation and no link). So each source is
parsed once by the static tier instead of twice. Generated code under the build dir is skipped.
Prints each failing file's diagnostics; exits 1 when any failed, 2 on bad usage.
"""

import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys


def syntax_only(entry: dict) -> list:
    """The entry's compile command, parsing only: no -o output, -fsyntax-only instead of -c."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD"):
            continue
        if a in ("-MT", "-MF"):
            skip = True
            continue
        out.append(a)
    return [*out, "-fsyntax-only"]


def check(entry: dict) -> tuple:
    r = subprocess.run(syntax_only(entry), cwd=entry["directory"], capture_output=True, text=True)
    return entry["file"], r.returncode, r.stdout + r.stderr


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    build = os.path.realpath(sys.argv[1])
    tidy_regex, jobs = re.compile(sys.argv[2]), int(sys.argv[3])
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    todo = [e for e in entries
            if not os.path.realpath(e["file"]).startswith(build + os.sep)
            and not tidy_regex.search(e["file"])]
    if not todo:
        print("check-threads: no sources outside tidy's set in the compile database",
              file=sys.stderr)
        return 2
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for path, rc, text in pool.map(check, todo):
            if rc != 0:
                failed.append(path)
                print(text, end="")
    if failed:
        print(f"check-threads: {len(failed)} of {len(todo)} sources failed:", *failed, sep="\n  ")
        return 1
    print(f"check-threads: {len(todo)} sources outside tidy's set parse clean "
          "(tidy checks the rest)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
