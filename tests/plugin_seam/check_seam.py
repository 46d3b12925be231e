#!/usr/bin/env python3
"""The closed plugin seam (docs/DESIGN.md "Seams"; issue 17 item 5), as a test.

Every storage plugin (plugins/storage/<name>/*.cc) must build against the plugin API,
daemon/include/ckptd, and nothing else of the daemon. For each plugin source this compiles it
again (-fsyntax-only) with the flags and defines its real compile command in the build's
compile_commands.json has, but with an include path cut down to:
  - daemon/include                      (the plugin API),
  - a directory holding only storage/<name> -> plugins/storage/<name>  (the plugin's own headers,
    as it includes them: "storage/<name>/x.h"; no other plugin's),
  - <build>/gen, as -isystem            (the generated protobuf headers),
  - the real command's include dirs outside the source tree and the build dir (system deps).
so an #include of a daemon-internal header ("common/limits.h", "io/...") fails to compile. Then
it reads the compiler's list of every header the source used (-MD) and fails if one inside the
source tree lies outside daemon/include/ckptd and the plugin's own directory: that catches an
escape through a relative path ("../../../daemon/src/common/limits.h"), which the include path
alone cannot stop. It also fails if a plugin directory has a source the build does not compile
(a plugin must be a ckptd_plugin() library).

Usage: check_seam.py <build dir> <source dir>      (exit 0: every plugin is closed)
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile

# Flags that take the next argument as their value, dropped with it.
DROP_WITH_ARG = {"-o", "-MF", "-MT", "-MQ", "-I", "-isystem", "-iquote", "-idirafter", "-include"}
DROP_PREFIX = ("-I", "-isystem", "-iquote", "-idirafter", "-MF", "-MT", "-MQ", "-o")
DROP = {"-c", "-MD", "-MMD", "-M", "-MM"}


def inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def include_dirs(args: list[str]) -> list[tuple[str, str]]:
    """(flag, dir) for every -I / -isystem / -iquote / -idirafter of a compile command."""
    out = []
    i = 0
    while i < len(args):
        a = args[i]
        for flag in ("-isystem", "-iquote", "-idirafter", "-I"):
            if a == flag and i + 1 < len(args):
                out.append((flag, args[i + 1]))
                i += 1
                break
            if a.startswith(flag) and len(a) > len(flag):
                out.append((flag, a[len(flag) :]))
                break
        i += 1
    return out


def strip(args: list[str]) -> list[str]:
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in DROP_WITH_ARG:
            skip = True
            continue
        if a in DROP or a.startswith(DROP_PREFIX):
            continue
        if a.endswith((".cc", ".cpp", ".cxx")):
            continue
        out.append(a)
    return out


def depfile_paths(text: str, cwd: str) -> list[str]:
    body = text.replace("\\\n", " ").split(":", 1)[1]
    return [os.path.realpath(os.path.join(cwd, p)) for p in body.split()]


def main() -> int:
    build = os.path.realpath(sys.argv[1])
    src = os.path.realpath(sys.argv[2])
    api = os.path.join(src, "daemon", "include", "ckptd")
    gen = os.path.join(build, "gen")
    plugins_root = os.path.join(src, "plugins", "storage")
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    commands = {os.path.realpath(os.path.join(e["directory"], e["file"])): e for e in entries}

    failures = []
    checked = 0
    for name in sorted(os.listdir(plugins_root)):
        pdir = os.path.join(plugins_root, name)
        if not os.path.isdir(pdir):
            continue
        for fname in sorted(os.listdir(pdir)):
            if not fname.endswith(".cc"):
                continue
            source = os.path.join(pdir, fname)
            rel = os.path.relpath(source, src)
            entry = commands.get(source)
            if entry is None:
                failures.append(f"{rel}: not compiled by the build (not a ckptd_plugin() library?)")
                continue
            args = entry.get("arguments") or shlex.split(entry["command"])
            # The real build's own include path holds nothing of the daemon but daemon/include.
            for _, d in include_dirs(args[1:]):
                d = os.path.realpath(os.path.join(entry["directory"], d))
                if inside(d, src) and not (d == os.path.join(src, "daemon", "include")
                                           or d == os.path.join(src, "plugins")
                                           or inside(d, build)):
                    failures.append(f"{rel}: the build compiles it with {d} on the include path")
            system = [("-isystem", d) for flag, d in include_dirs(args[1:])
                      if not inside(os.path.realpath(os.path.join(entry["directory"], d)), src)
                      and not inside(os.path.realpath(os.path.join(entry["directory"], d)), build)]
            with tempfile.TemporaryDirectory() as tmp:
                own = os.path.join(tmp, "own")
                os.makedirs(os.path.join(own, "storage"))
                os.symlink(pdir, os.path.join(own, "storage", name))
                dep = os.path.join(tmp, "deps.d")
                cmd = [args[0], *strip(args[1:]), "-I", os.path.join(src, "daemon", "include"),
                       "-I", own, "-isystem", gen]
                for flag, d in system:
                    cmd += [flag, d]
                cmd += ["-fsyntax-only", "-MD", "-MF", dep, source]
                run = subprocess.run(cmd, cwd=entry["directory"], capture_output=True, text=True)
                checked += 1
                if run.returncode != 0:
                    failures.append(f"{rel}: does not compile against daemon/include only:\n"
                                    f"  {shlex.join(cmd)}\n{run.stderr}")
                    continue
                with open(dep) as f:
                    used = depfile_paths(f.read(), entry["directory"])
            for header in used:
                if header == source or not (inside(header, src) or inside(header, build)):
                    continue  # the source itself, or a system header
                if inside(header, api) or inside(header, pdir) or inside(header, gen):
                    continue
                failures.append(f"{rel}: includes {os.path.relpath(header, src)}, which is not "
                                "part of the plugin API (daemon/include/ckptd) nor of the plugin")
    if checked == 0:
        failures.append(f"no plugin source found under {plugins_root}")
    for f in failures:
        print("plugin seam:", f, file=sys.stderr)
    if not failures:
        print(f"plugin seam: {checked} plugin sources build against daemon/include/ckptd only")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
