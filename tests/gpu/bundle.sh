#!/usr/bin/env bash
# Packs what the GPU check (tests/gpu/run.sh) needs on a machine that has an NVIDIA GPU but none of
# the build's packages: the stripped daemon, ckptctl and test binaries of build/, the shared
# libraries they load (Debian's gRPC, RocksDB, ...), and the Python package with its extension
# built for that machine's Python (build-py312/, see PY below). Writes .gpu/bundle.tar.xz.
# build-py312/ once (pybind11 from another Python's site-packages where PY has none), then its
# extension only:
#   cmake -S . -B build-py312 -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTD_BUILD_PYTHON=ON \
#     -DPython_EXECUTABLE=$PY -Dpybind11_DIR=$(python3 -m pybind11 --cmakedir)
#   cmake --build build-py312 --target _ckptd
# On the machine, tests/gpu/run.sh also installs wheels carried in .whl/ (DeepSpeed: RESULTS.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PY:-/root/.pyenv/versions/3.12.1/bin/python3}
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/bin "$STAGE"/lib "$STAGE"/py/ckptd .gpu
for b in build/ckptd build/ckptctl build/tests/ckptd_integration_tests build/tests/ckptd_testclient; do
  strip -o "$STAGE/bin/$(basename "$b")" "$b"
done
EXT=$(ls build-py312/client/python/_ckptd.cpython-312-*.so)
strip -o "$STAGE/py/ckptd/$(basename "$EXT")" "$EXT"
tar -C client/python --exclude=__pycache__ -cf - ckptd | tar -C "$STAGE/py" -xf -  # subpackages too
# Every shared library outside glibc/libstdc++ (the target has newer ones) and the CUDA driver.
for f in "$STAGE"/bin/* "$STAGE"/py/ckptd/*.so; do ldd "$f"; done | awk '/=> \//{print $3}' | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux-x86-64|libgcc_s|libstdc\+\+|libcuda)\.so' |
  while read -r lib; do cp -L "$lib" "$STAGE/lib/"; done
tar -C "$STAGE" -cJf .gpu/bundle.tar.xz .
ls -la .gpu/bundle.tar.xz
