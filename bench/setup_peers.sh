#!/usr/bin/env bash
# Install the comparison peers used by the benchmark (ByteCheckpoint) plus matplotlib for plots.
#
# ByteCheckpoint 0.0.2 declares torch<=2.5.0; this repo runs torch 2.13.0 (CPU build), so the
# package itself is installed with --no-deps and its other declared runtime requirements are
# installed by name. torch is never allowed to change: a constraints file pins the installed
# version, and the version is re-checked after every install step (the script aborts otherwise).
# Safe to run twice: every step is skipped when its module is already importable.
set -euo pipefail

PY="${PYTHON:-python3}"
BCP_VERSION="0.0.2"

torch_version() { "$PY" -c 'import torch; print(torch.__version__)'; }

TORCH_BEFORE="$(torch_version)"
echo "setup_peers: torch ${TORCH_BEFORE}"

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==${TORCH_BEFORE}" >"$CONSTRAINTS"

check_torch() {
  local now
  now="$(torch_version)"
  if [[ "$now" != "$TORCH_BEFORE" ]]; then
    echo "setup_peers: torch changed from ${TORCH_BEFORE} to ${now}; aborting" >&2
    exit 1
  fi
}

# have MODULE [DIST VERSION]: true when MODULE imports (and, if given, DIST's version matches).
have() {
  BYTECHECKPOINT_LOGGING_LEVEL=ERROR "$PY" - "$@" >/dev/null 2>&1 <<'PYEOF'
import importlib, importlib.metadata as md, sys
mod = sys.argv[1]
importlib.import_module(mod)
if len(sys.argv) > 3 and md.version(sys.argv[2]) != sys.argv[3]:
    sys.exit(1)
PYEOF
}

pip_install() {
  "$PY" -m pip install --disable-pip-version-check -c "$CONSTRAINTS" "$@"
  check_torch
}

# Runtime requirements declared in bytecheckpoint-0.0.2 METADATA Requires-Dist (torch excluded;
# numpy, safetensors, typing-extensions are usually present already). None depends on torch.
# grpcio + protobuf are imported at import time (bytecheckpoint.utilities.server); mmh3,
# universal-pathlib and cachetools are declared but not imported by 0.0.2, installed for fidelity.
# The exact pins (grpcio==1.69.0, protobuf==3.20.3) are used only when the module is missing, so
# an already installed grpcio/protobuf is never downgraded (the final import check still runs).
have grpc || pip_install "grpcio==1.69.0"
have google.protobuf || pip_install "protobuf==3.20.3"
have mmh3 || pip_install "mmh3>=4.1.0,<=4.2.0"
have upath || pip_install "universal-pathlib>=0.2.2,<=1.0.0"
have cachetools || pip_install "cachetools>=5.4.0,<=10.0.0"
have safetensors || pip_install "safetensors>=0.4.5,<=1.0.0"
have numpy || pip_install numpy
have typing_extensions || pip_install typing-extensions

# The package itself, without its torch<=2.5.0 requirement.
if ! have bytecheckpoint bytecheckpoint "$BCP_VERSION"; then
  pip_install --no-deps "bytecheckpoint==${BCP_VERSION}"
fi

have matplotlib || pip_install matplotlib

# boto3 (its s3transfer is the peer of bench/remote_bench.py); pinned, installed only if missing.
have boto3 || pip_install "boto3==1.43.11"

# fio measures the data directory's O_DIRECT limits (a Debian package).
if ! command -v fio >/dev/null; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends fio
fi

check_torch
BYTECHECKPOINT_LOGGING_LEVEL=ERROR "$PY" -c 'import bytecheckpoint, torch
print("setup_peers: bytecheckpoint", bytecheckpoint.__version__, "torch", torch.__version__)'
