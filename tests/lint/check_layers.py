#!/usr/bin/env python3
"""The daemon's modules include one way (make lint: check-layers).

Usage: check_layers.py

Every module of daemon/src (one folder; the options, daemon/src/*.{h,cc}, count as one) has a
layer in LAYERS below, lowest first. A source of a module may include headers of its own module
and of modules in lower layers only: never one of its own layer's other modules, nor of a higher
layer. So the layers run one way, and each module's unit tests link it and what is below it
alone. (daemon/main.cc, which composes everything, sits above them all and is not checked.)

No module of daemon/src includes a storage plugin's header (plugins/storage/<name>/..., as
"storage/<name>/x.h" or by a relative path into plugins/): the core sees a store only through the
plugin API (ckptd/storage.h) and opens it by URI through the registry (ckptd/storage_registry.h);
daemon/main.cc alone registers the plugins.

Prints "path:line: <module> (layer N) includes "<header>" of <module> (layer M)" per finding
(and "path:line: <module> includes the storage plugin header ..." per plugin include);
exits 1 on any finding, 2 on a folder of daemon/src that LAYERS does not place.
"""

import os
import re
import subprocess
import sys

# Lowest first. A module may include only modules of lower layers (and itself).
LAYERS = [
    # Independent of every other module: limits, pools and executors, logging, the clock; the
    # CUDA driver, dlopen'ed.
    ["common", "cuda"],
    # Each over common (and cuda) only: pure formats and checksums; the index (its MetaStore and
    # the committer that group-commits its writes); the Io seam; metrics; staging memory; the
    # daemon's options.
    ["format", "index", "io", "metrics", "dataplane", "options"],
    # The tiers a staged rank moves through (local, RAM, remote, retention's plan) and the peer
    # tier's interface.
    ["tier"],
    # The peer channel between daemons: the peer tier's implementation.
    ["peer"],
    # The daemon core: the checkpoint lifecycle, catalog, loads, recovery.
    ["service"],
    # The gRPC adapter and the listeners, over the service.
    ["rpc"],
]

SRC = "daemon/src"
# The concrete storage plugins, each included as "storage/<name>/..." by who may (main.cc, tests).
PLUGINS = "plugins"
# Headers at daemon/src itself: the options module.
ROOT_MODULE = "options"
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def layer_of() -> dict:
    return {m: i for i, layer in enumerate(LAYERS) for m in layer}


def module_of_path(path: str) -> str:
    rel = os.path.relpath(path, SRC)
    return rel.split(os.sep)[0] if os.sep in rel else ROOT_MODULE


def module_of_include(header: str, modules: set) -> str:
    """The module a quoted include names, or "" for headers outside daemon/src (the plugin API
    ckptd/..., generated protobuf headers, third-party libraries)."""
    first = header.split("/")[0]
    if "/" in header and first in modules:
        return first
    if "/" not in header and os.path.exists(os.path.join(SRC, header)):
        return ROOT_MODULE
    return ""


def is_plugin_header(header: str, including: str) -> bool:
    """True if a quoted include names a file of a storage plugin: "storage/s3/s3_storage.h" as
    the plugins' include root spells it, or any path (relative to the including file) that lies
    under plugins/."""
    if header.startswith("storage/") and os.path.exists(os.path.join(PLUGINS, header)):
        return True
    resolved = os.path.normpath(os.path.join(os.path.dirname(including), header))
    return resolved.split(os.sep)[0] == PLUGINS or f"{PLUGINS}/" in header


def main() -> int:
    layers = layer_of()
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", SRC],
        check=True, capture_output=True).stdout.decode()
    files = sorted(f for f in out.split("\0") if f.endswith((".h", ".cc")) and os.path.exists(f))
    dirs = {module_of_path(f) for f in files}
    unplaced = sorted(dirs - set(layers))
    if unplaced:
        print(f"check-layers: {SRC}/{{{','.join(unplaced)}}} has no layer: add it to LAYERS in "
              f"{sys.argv[0]}")
        return 2
    failed = False
    for path in files:
        mod = module_of_path(path)
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                if is_plugin_header(m.group(1), path):
                    print(f'{path}:{n}: {mod} includes the storage plugin header "{m.group(1)}": '
                          "the daemon core names no plugin (ckptd/storage.h, and the registry "
                          "ckptd/storage_registry.h that daemon/main.cc fills)")
                    failed = True
                    continue
                inc = module_of_include(m.group(1), set(layers))
                if inc and inc != mod and layers[inc] >= layers[mod]:
                    print(f'{path}:{n}: {mod} (layer {layers[mod]}) includes "{m.group(1)}" of '
                          f"{inc} (layer {layers[inc]}): a module includes only lower layers")
                    failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
